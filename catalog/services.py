"""The use cases every interface calls (console, API, CLI, admin): preview a context change,
request one, roll one back.

Nothing else writes a model's context, its longest answer or its profiles' arguments for a
change. `catalog.domain.plan` decides; this module applies the decision in one transaction
(catalog, audit record, and the rollout queued on commit) and `catalog.tasks.rollout`
restarts the replicas afterwards.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Prefetch
from django.utils import timezone

from catalog import audit, plan_inputs, tasks
from catalog.choices import ChangeKind, ChangeState, Engine, Source
from catalog.domain.args import get_int
from catalog.domain.shape import Shape
from catalog.fleet import surge_possible as fleet_surge_possible
from catalog.domain.plan import (
    PARALLEL,
    ChangeRequest,
    GPUClassInput,
    ModelInput,
    Plan,
    ProfileInput,
    plan_change,
)
from catalog.models import Change, Model, Profile

log = logging.getLogger(__name__)

ACTIVE_STATES = (ChangeState.QUEUED, ChangeState.RUNNING)
CONTEXT_PERMISSION = "catalog.change_context"


# ----------------------------------------------------------------------------- errors


class ServiceError(Exception):
    """A use case said no: a message for people, an HTTP-like status, and the field at fault."""

    status = 400

    def __init__(self, message: str, status: int | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.field = field


class NotFound(ServiceError):
    status = 404


class Refused(ServiceError):
    """The plan refused the change; `.plan` says why (and what it would have done),
    `.change` is the audit row written for it (None for a preview or an unaudited user)."""

    status = 400

    def __init__(self, message: str, *, plan: Plan | None = None, field: str | None = None, change: Change | None = None):
        super().__init__(message, field=field)
        self.plan = plan
        self.change = change


class Conflict(ServiceError):
    """Another change of the model is queued or running: `.change` is that one."""

    status = 409

    def __init__(self, message: str, *, change: Change | None = None):
        super().__init__(message, field="model")
        self.change = change


class Forbidden(ServiceError):
    status = 403


# ----------------------------------------------------------------------------- reading


LOG_LINES_MAX = 5000


def replica_log(replica, lines: int = 50) -> str:
    """A replica's last engine log lines, as the fleet reads them (the replica may run on
    another machine, behind its node's worker); a log that cannot be read is said so."""
    from catalog import fleet

    try:
        return fleet.read_log(replica, lines=max(1, min(lines, LOG_LINES_MAX)))
    except Exception as e:  # noqa: BLE001 - the fleet's backends raise what their transport raises
        return f"(its log could not be read: {e})"


def can_change_context(user) -> bool:
    return bool(user is not None and getattr(user, "is_active", False) and user.has_perm(CONTEXT_PERMISSION))


def _models_for_planning():
    """Models with what a plan needs, in two queries whatever the number of profiles."""
    return Model.objects.prefetch_related(
        Prefetch("profiles", queryset=Profile.objects.select_related("gpu_class").order_by("name"))
    )


def model_input(model: Model) -> ModelInput:
    """The domain's view of a model row. From a model of `_models_for_planning()` (profiles
    and their GPU classes prefetched) the rows cost no query; the fleet's answer to whether
    each profile's nodes have room for a second copy during a restart costs one."""
    rows = list(model.profiles.all())
    room = fleet_surge_possible(rows)
    profiles = []
    for p in rows:
        gpu = p.gpu_class
        profiles.append(
            ProfileInput(
                name=p.name,
                engine=p.engine,
                args=tuple(str(a) for a in (p.args or [])),
                gpu_class=GPUClassInput(gpu.name, gpu.memory_gb, gpu.usable_gb) if gpu else None,
                gpus_per_node=p.gpus_per_node,
                tp=p.tp,
                pp=p.pp,
                nodes=p.nodes,
                cpu_only=p.cpu_only,
                min_memory_gb=p.min_memory_gb,
                surge_possible=room.get(p.id, True),
            )
        )
    return ModelInput(
        name=model.name,
        context_length=model.context_length,
        max_output=model.max_output,
        declared=model.declared,
        profiles=tuple(profiles),
    )


def _shape_of(model: Model):
    """(Shape | None, note): the cached shape, read once per source (catalog.shapes does the I/O)."""
    from catalog import shapes

    try:
        return shapes.shape_of(model)
    except Exception as e:  # noqa: BLE001 - an unreadable shape is said in the plan, not a failure
        log.exception("the shape of %s could not be read", model.name)
        return None, f"its shape could not be read ({e}), so the memory it needs is not checked"


def _plan(model: ModelInput | None, name: str, request: ChangeRequest, shape=None, note: str = "") -> Plan:
    return plan_change(model, shape, note, request, name=name, default_max_output_cap=settings.LLMGW_DEFAULT_MAX_OUTPUT)


def _not_found(name: str) -> NotFound:
    refusal = _plan(None, name, ChangeRequest()).refusal
    return NotFound(refusal.message, field=refusal.field)


def _planning_inputs(name: str) -> tuple[ModelInput, Shape | None, str]:
    """What a preview plans from (4 queries, or the shape's first read); NotFound without a model."""
    model = _models_for_planning().filter(name=name).first()
    if model is None:
        raise _not_found(name)
    shape, note = _shape_of(model)
    return model_input(model), shape, note


def preview(name: str, *, tokens: int = 0, slots: int = 0, max_output: int = 0) -> Plan:
    """What the change would do, or why it would be refused. Writes nothing (but the shape's
    cache). Plans from inputs kept while the catalog does not change (catalog.plan_inputs)."""
    model, shape, note = plan_inputs.cached(name, lambda: _planning_inputs(name))
    return _plan(model, name, ChangeRequest(tokens=tokens, slots=slots, max_output=max_output), shape, note)


# ----------------------------------------------------------------------------- changing


def _snapshot(plan: Plan, model: Model, *, after: bool) -> dict:
    """A model's context, longest answer, and every profile's args and memory, before or after."""
    min_memory = {p.name: p.min_memory_gb for p in model.profiles.all()}
    profiles = {}
    for pp in plan.profiles:
        memory = pp.memory_after if after else pp.memory_before
        profiles[pp.profile] = {
            "engine": pp.engine,
            "args": list(pp.args_after if after else pp.args_before),
            "memory": memory.text if memory is not None else "",
            "min_memory_gb": pp.min_memory_gb_after if after else min_memory.get(pp.profile, 0),
        }
    return {
        "context_length": plan.context_after if after else plan.context_before,
        "max_output": plan.max_output_after if after else plan.max_output_before,
        "profiles": profiles,
    }


def _active_change(model_id: int) -> Change | None:
    return Change.objects.filter(model_id=model_id, state__in=ACTIVE_STATES).order_by("created_at", "id").first()


def _conflict(model_name: str, active: Change | None) -> Conflict:
    if active is None:
        return Conflict(f"another change of {model_name} is queued or running: wait for it to end")
    return Conflict(
        f"change {active.pk} of {model_name} is {active.state}: wait for it to end, then try again",
        change=active,
    )


def _enqueue_rollout(change_id: int) -> None:
    """Hand the rollout to a worker. Called on commit; when the broker cannot be reached the
    change stays queued and the periodic sweeper (catalog.tasks.sweep_queued_changes) queues
    it again once it is back, so the request still succeeds."""
    try:
        tasks.rollout.apply_async((change_id,), retry=False)
    except Exception:  # noqa: BLE001 - a broker down must not fail a committed change
        log.warning("change %s: the rollout could not be queued now; the sweeper will queue it", change_id, exc_info=True)


def request_change(
    name: str,
    *,
    tokens: int = 0,
    slots: int = 0,
    max_output: int = 0,
    message: str = "",
    user,
    source: str,
    kind: str | None = None,
    rollback_of: Change | None = None,
) -> Change:
    """Change a model's context (and longest answer), or its longest answer alone.

    Raises Forbidden (nothing written), NotFound, Conflict (another change of the model is
    queued or running), or Refused (only the audit row of the attempt is written). A context
    change comes back `queued`, its rollout queued once the transaction commits; a
    longest-answer-only change comes back `succeeded`: nothing restarts."""
    if not can_change_context(user):
        raise Forbidden("you may not change a model's context (permission catalog.change_context)")
    if source not in Source.values:
        raise ValueError(f"unknown source {source!r}: one of {', '.join(Source.values)}")
    request = ChangeRequest(tokens=tokens, slots=slots, max_output=max_output)
    found = Model.objects.filter(name=name).prefetch_related("files").first()
    if found is None:
        raise _not_found(name)
    # The shape may need I/O the first time: read it before taking the model's lock.
    shape, note = _shape_of(found)

    refused: Refused | None = None
    try:
        with transaction.atomic():
            model = _models_for_planning().select_for_update().filter(pk=found.pk).first()
            if model is None:  # removed in the meantime
                raise _not_found(name)
            active = _active_change(model.pk)
            if active is not None:
                raise _conflict(model.name, active)
            plan = _plan(model_input(model), name, request, shape, note)
            if plan.refusal is not None:
                audit_row = None
                if plan.refusal.status != 404:
                    audit_row = audit.record_refusal(
                        model,
                        user=user,
                        source=source,
                        message=message,
                        request=_request_dict(request),
                        plan=plan.to_dict(),
                        error=plan.refusal.message,
                        kind=kind or (ChangeKind.MAX_OUTPUT if plan.output_only else ChangeKind.CONTEXT),
                        rollback_of=rollback_of,
                    )
                refused = Refused(plan.refusal.message, plan=plan, field=plan.refusal.field, change=audit_row)
            else:
                change = _apply(model, plan, request, message=message, user=user, source=source, kind=kind, rollback_of=rollback_of)
    except IntegrityError as e:
        if not _one_active_violated(e):
            raise
        # The database's one-active-change-per-model constraint: another request won the race.
        raise _conflict(name, _active_change(found.pk)) from None
    if refused is not None:
        raise refused
    return change


def _one_active_violated(e: IntegrityError) -> bool:
    """Whether the error is the partial unique index `change_one_active_per_model`
    (PostgreSQL names it; SQLite names the column)."""
    text = str(e)
    return "change_one_active_per_model" in text or "catalog_change.model_id" in text


def _request_dict(request: ChangeRequest) -> dict:
    return {"tokens": request.tokens, "slots": request.slots, "max_output": request.max_output}


def _apply(model: Model, plan: Plan, request: ChangeRequest, *, message, user, source, kind, rollback_of) -> Change:
    """Write the catalog and the change (inside the caller's transaction); queue the rollout on commit."""
    before = _snapshot(plan, model, after=False)
    after = _snapshot(plan, model, after=True)

    model.context_length = plan.context_after
    model.max_output = plan.max_output_after
    model.save(update_fields=["context_length", "max_output", "updated_at"])

    by_name = {p.name: p for p in model.profiles.all()}
    changed = []
    for pp in plan.profiles:
        profile = by_name.get(pp.profile)
        if profile is None:
            continue
        profile.args = list(pp.args_after)
        if profile.cpu_only:
            profile.min_memory_gb = pp.min_memory_gb_after
        changed.append(profile)
    if changed and not plan.output_only:
        Profile.objects.bulk_update(changed, ["args", "min_memory_gb"])

    # A longest-answer-only change is done at once: nothing restarts.
    now = timezone.now() if plan.output_only else None
    change = audit.record_change(
        model,
        kind=kind or (ChangeKind.MAX_OUTPUT if plan.output_only else ChangeKind.CONTEXT),
        state=ChangeState.SUCCEEDED if plan.output_only else ChangeState.QUEUED,
        user=user,
        source=source,
        message=message,
        request=_request_dict(request),
        plan=plan.to_dict(),
        before=before,
        after=after,
        rollback_of=rollback_of,
        started_at=now,
        finished_at=now,
    )
    _mark_rolled_back(rollback_of)
    if not plan.output_only:
        change_id = change.pk
        transaction.on_commit(lambda: _enqueue_rollout(change_id))
    return change


def _mark_rolled_back(original: Change | None) -> None:
    """The change a rollback undoes: the catalog is back where it was, so it is rolled back
    (and the console offers no second rollback of it); the rollback's own state says how
    the restart went."""
    if original is not None:
        Change.objects.filter(pk=original.pk).exclude(state__in=ACTIVE_STATES).update(state=ChangeState.ROLLED_BACK)


def rollback(change_id: int, *, user, source: str, message: str = "") -> Change:
    """A new change (kind rollback) back to what `change_id` changed from: its context, its
    llama.cpp slots and its longest answer, through the same path as any change."""
    if not can_change_context(user):
        raise Forbidden("you may not change a model's context (permission catalog.change_context)")
    original = Change.objects.select_related("model").filter(pk=change_id).first()
    if original is None:
        raise NotFound(f"no change {change_id}", field="change")
    if original.state == ChangeState.REFUSED:
        raise ServiceError(f"change {change_id} was refused: it changed nothing to roll back", field="change")
    before = original.before or {}
    context = int(before.get("context_length") or 0)
    max_output = int(before.get("max_output") or 0)
    why = message or f"roll back change {change_id}"
    # A change of the longest answer alone is rolled back the same way: nothing restarts.
    output_only = (original.plan or {}).get("output_only") or original.kind == ChangeKind.MAX_OUTPUT
    if output_only and max_output <= 0:
        raise ServiceError(
            f"change {change_id} set a limit where there was none: set the longest answer by hand",
            field="max_output",
        )
    return request_change(
        original.model.name,
        tokens=0 if output_only else context,
        slots=0 if output_only else _slots_before(original),
        max_output=max_output,
        message=why,
        user=user,
        source=source,
        kind=ChangeKind.ROLLBACK,
        rollback_of=original,
    )


def _slots_before(change: Change) -> int:
    """The llama.cpp slots a rollback asks for. A change that kept each profile's --parallel
    (slots 0) is rolled back the same way; one that set them all is set back to what they
    had (when they had different ones, the most common, the fewer on a tie: less memory)."""
    if not int((change.request or {}).get("slots") or 0):
        return 0
    counts: dict[int, int] = {}
    for profile in ((change.before or {}).get("profiles") or {}).values():
        if profile.get("engine") == Engine.LLAMACPP:
            n = max(get_int(list(profile.get("args") or []), *PARALLEL), 1)
            counts[n] = counts.get(n, 0) + 1
    if not counts:
        return 0
    return min(counts, key=lambda n: (-counts[n], n))
