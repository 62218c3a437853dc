"""The one place that writes audit records.

Every change of a model's context or longest answer, and every refused attempt by someone
allowed to make one, is a `Change` row (who, why, from where, what was asked, the plan,
before and after) and a Django admin `LogEntry` on the model, so it shows in the admin's
History of that model with a sentence a person can read. Written explicitly by the
services, inside their transaction: never from signals.
"""

from __future__ import annotations

from django.contrib.admin.models import CHANGE, LogEntry
from django.utils import timezone

from catalog.choices import ChangeKind, ChangeState
from catalog.models import Change, Model

# LogEntry.change_message is a text field; keep a long "why" from swamping the history.
MAX_WHY = 500


def _who(user) -> str:
    if user is None:
        return "someone"
    return user.get_username() or f"user {user.pk}"


def _numbers(before: int, after: int) -> str:
    return f"{before} → {after}" if before != after else f"{after} (unchanged)"


def describe(change: Change) -> str:
    """One sentence for the admin's history: who, from where, what, and why."""
    before, after = change.before or {}, change.after or {}
    plan = change.plan or {}
    who = f"{_who(change.user)} via {change.get_source_display()}"
    if change.state == ChangeState.REFUSED:
        req = change.request or {}
        asked = []
        if req.get("tokens"):
            asked.append(f"context {plan.get('context_before', '?')} → {req['tokens']}")
        if req.get("slots"):
            asked.append(f"{req['slots']} slots")
        if req.get("max_output"):
            asked.append(f"longest answer {plan.get('max_output_before', '?')} → {req['max_output']}")
        what = f"refused {change.get_kind_display().lower()} change ({', '.join(asked) or 'nothing asked'}): {change.error}"
    else:
        what = (
            f"{change.get_kind_display().lower()} change {change.pk} ({change.get_state_display().lower()}): "
            f"context {_numbers(before.get('context_length', 0), after.get('context_length', 0))}, "
            f"longest answer {_numbers(before.get('max_output', 0), after.get('max_output', 0))}"
        )
        if change.rollback_of_id:
            what += f", rolling back change {change.rollback_of_id}"
    why = (change.message or "").strip()
    if len(why) > MAX_WHY:
        why = why[: MAX_WHY - 1] + "…"
    return f"{what}; by {who}; why: {why or '(no reason given)'}"


def _log(model: Model, change: Change) -> None:
    if change.user_id is None:
        return  # LogEntry needs a user; every change through the services has one
    LogEntry.objects.log_actions(
        user_id=change.user_id,
        queryset=[model],
        action_flag=CHANGE,
        change_message=describe(change),
        single_object=True,
    )


def record_change(
    model: Model,
    *,
    kind: str,
    state: str,
    user,
    source: str,
    message: str,
    request: dict,
    plan: dict,
    before: dict,
    after: dict,
    rollback_of: Change | None = None,
    started_at=None,
    finished_at=None,
) -> Change:
    """The Change row of a change being made, and its history entry on the model."""
    change = Change.objects.create(
        model=model,
        kind=kind,
        state=state,
        user=user,
        source=source,
        message=message,
        request=request,
        before=before,
        after=after,
        plan=plan,
        rollback_of=rollback_of,
        started_at=started_at,
        finished_at=finished_at,
    )
    _log(model, change)
    return change


def record_refusal(
    model: Model,
    *,
    user,
    source: str,
    message: str,
    request: dict,
    plan: dict,
    error: str,
    kind: str = ChangeKind.CONTEXT,
    rollback_of: Change | None = None,
) -> Change | None:
    """The audit row of a refused attempt: nothing else changes. Recorded only for users
    allowed to change contexts (anyone else is stopped before planning, and is not audited)."""
    if user is None or not user.has_perm("catalog.change_context"):
        return None
    context = model.context_length
    max_output = model.max_output
    change = Change.objects.create(
        model=model,
        kind=kind,
        state=ChangeState.REFUSED,
        user=user,
        source=source,
        message=message,
        request=request,
        before={"context_length": context, "max_output": max_output},
        after={},
        plan=plan,
        error=error,
        rollback_of=rollback_of,
        finished_at=timezone.now(),
    )
    _log(model, change)
    return change
