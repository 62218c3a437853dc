"""The browser console (SPEC §7): plain function views over `catalog.services`.

The console decides nothing about a change: `services.preview` says what a change would do
or why it is refused, `services.request_change` makes it, `services.rollback` undoes it.
These views parse the form, call the service and render the answer; with htmx they render a
named partial of the same template (`"page.html#partial"`), without it the whole page."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

from django.core.paginator import Paginator
from django.db.models import Count, OuterRef, Prefetch, Q, Subquery
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect, HttpResponseStopPolling, trigger_client_event

from . import services
from .choices import ChangeState, Engine, ReplicaState, Source
from .domain.args import get_arg
from .domain.shape import Shape
from .forms import ContextForm, HistoryFilterForm
from .models import Change, ChangeStep, Model, Replica


def live_replicas(prefix: str = "") -> Q:
    """Replicas that stand for a running engine (a failed one until the fleet stops it);
    stopped ones are history."""
    return Q(**{f"{prefix}state__in": [ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING]}) | Q(
        **{f"{prefix}state": ReplicaState.FAILED, f"{prefix}stopped_at__isnull": True}
    )


RESTART_LABELS = {
    "surge": "new before old: a new replica starts, is checked, then the old one drains and stops",
    "in_place": "in place: each replica drains, stops and starts again (no room for a second copy)",
    "none": "nothing restarts",
}
ENGINE_LABELS = dict(Engine.choices)
LOG_LINES = 50


# ----------------------------------------------------------------------------- presentation
# Plans come as `catalog.domain.plan.Plan` (a preview) or as its `to_dict()` (a change's
# record, read through `_record` so that both are read by attribute); the view objects
# below are what templates draw.


def _record(value):
    """A plan's record (dicts and lists, as a change keeps it) readable like the Plan itself:
    each dict a namespace, at any depth (an empty one: None, nothing known); a key a record
    lacks reads as getattr's default."""
    if isinstance(value, dict):
        if not value:
            return None
        return SimpleNamespace(**{str(k): _record(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_record(v) for v in value]
    return value


def arg_diff(before: Sequence[str], after: Sequence[str], changed_flags: Sequence[str]) -> SafeString:
    """The arguments after the change as HTML, each changed flag marked with its old value
    struck out (added when it had none). Built here with f-strings rather than in a template
    loop or format_html: a plan has a few dozen arguments per profile, and the preview
    renders on every keystroke. Every argument is escaped (`_e`)."""
    before, after = list(before or ()), list(after or ())
    parts = []
    i = 0
    while i < len(after):
        a = after[i]
        flag = a.partition("=")[0] if a.startswith("-") else None
        if flag not in changed_flags:
            parts.append(f'<span class="arg">{_e(a)}</span>')
            i += 1
            continue
        if a == flag and i + 1 < len(after):
            value, sep, i = after[i + 1], " ", i + 2
        else:
            value, sep, i = a[len(flag) + 1 :], "=", i + 1
        old = get_arg(before, flag)
        struck = f'<del title="before">{_e(old)}</del>' if old is not None and old != value else ""
        parts.append(
            f'<span class="arg changed{" added" if old is None else ""}">{_e(flag)}{sep}{struck}'
            f'<ins title="after">{_e(value)}</ins></span>'
        )
    return mark_safe(" ".join(parts))  # noqa: S308 - every argument is escaped


def _e(text) -> str:
    """HTML-escaped text (what Django's escape does, without its lazy-string wrapper)."""
    return html.escape(str(text), quote=True)


def _finite(x) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


MEMORY_KINDS = (("weights", "weights_gb"), ("kv", "kv_gb"), ("state", "state_gb"), ("reserve", "reserve_gb"))
DOES_NOT_FIT = ' <strong class="bad">does not fit</strong>'
USABLE_KEY = ' <span class="key key-usable"></span>usable'


def memory_html(*labelled: tuple[str, object]) -> SafeString | None:
    """Memory bars, one per (label, MemoryTerms) given, on one scale (the card's usable
    memory, or the largest need): weights / KV / state / reserve, the usable line, and the
    part past it hatched red; None when no terms are known. HTML built here with f-strings
    (text escaped by `_e`, numbers formatted): the preview draws it for every profile on
    every keystroke, and a template loop costs ten times more."""
    terms = [(label, t) for label, t in labelled if t]
    if not terms:
        return None
    usable = next(filter(None, (_finite(getattr(t, "usable_gb", None)) for _, t in reversed(terms))), None)
    needs = [_finite(getattr(t, "need_gb", None)) or 0.0 for _, t in terms]
    scale = max([usable or 0.0, *needs]) or 1.0
    line = zone = ""
    if usable:
        left = f"{100 * usable / scale:.2f}"
        zone = f'<span class="mem-zone" style="left:{left}%"></span>'
        line = f'<span class="mem-usable" style="left:{left}%" title="usable: {usable:g} GB a card"></span>'
    rows = []
    for label, t in terms:
        segments = []
        for kind, attr in MEMORY_KINDS:
            gb = _finite(getattr(t, attr, None)) or 0.0
            if gb > 0:
                segments.append(f'<span class="seg seg-{kind}" style="width:{100 * gb / scale:.2f}%" title="{kind}: {gb:.1f} GB"></span>')
        label, text = _e(label), _e(getattr(t, "text", "") or "—")
        over = getattr(t, "fits", None) is False
        rows.append(
            f'<div class="mem-row{" over" if over else ""}"><span class="mem-label">{label}</span>'
            f'<div class="mem-track" role="img" aria-label="{label}: {text}">{zone}{"".join(segments)}{line}</div>'
            f'<span class="mem-text">{text}{DOES_NOT_FIT if over else ""}</span></div>'
        )
    legend = (
        '<div class="mem-legend"><span class="key seg-weights"></span>weights <span class="key seg-kv"></span>KV cache '
        '<span class="key seg-state"></span>state <span class="key seg-reserve"></span>reserve'
        f'{USABLE_KEY if usable else ""}</div>'
    )
    where = _e(getattr(terms[-1][1], "where", "card"))
    return mark_safe(f'<div class="mem mem-{where}">{"".join(rows)}{legend}</div>')  # noqa: S308 - text escaped


@dataclass
class ProfileView:
    name: str
    engine: str
    engine_label: str
    args: SafeString
    memory: SafeString | None
    restart: str
    restart_label: str
    refusal: str
    note: str

    @property
    def card(self) -> SafeString:
        """The profile's plan as the preview and the change page draw it: name, engine,
        restart policy, refusal, the argument diff, the memory bars, the note. HTML built
        here (text escaped by `_e`) for the same reason as the bars: eight of these on
        every keystroke cost a template five times more."""
        parts = [
            f'<article class="profile{" refused" if self.refusal else ""}" data-profile="{_e(self.name)}"><header>'
            f'<h3>{_e(self.name)}</h3> <span class="tag">{_e(self.engine_label)}</span> '
            f'<span class="restart restart-{_e(self.restart)}" title="restart policy">{_e(self.restart_label)}</span>'
            "</header>"
        ]
        if self.refusal:
            parts.append(f'<p class="error" role="alert">{_e(self.refusal)}</p>')
        parts.append(f'<code class="argv">{self.args or NO_ARGUMENTS}</code>')
        if self.memory:
            parts.append(self.memory)
        if self.note:
            parts.append(f'<p class="note">{_e(self.note)}</p>')
        parts.append("</article>")
        return mark_safe("".join(parts))  # noqa: S308 - text escaped; args and memory are built escaped


NO_ARGUMENTS = '<span class="muted">no arguments</span>'


@dataclass
class PlanView:
    ok: bool
    output_only: bool
    context_before: int
    context_after: int
    max_output_before: int
    max_output_after: int
    trained: int
    slots: int
    notes: list[str]
    refusal_field: str
    refusal: str
    profiles: list[ProfileView] = field(default_factory=list)

    @property
    def restarts(self) -> bool:
        return any(p.restart != "none" for p in self.profiles)


def plan_view(plan) -> PlanView | None:
    """What the templates draw of a Plan (or of its to_dict())."""
    if not plan:
        return None
    if isinstance(plan, dict):
        plan = _record(plan)
    refusal = getattr(plan, "refusal", None)
    profiles = []
    for p in getattr(plan, "profiles", ()) or ():
        restart = getattr(p, "restart", "none")
        before, after = getattr(p, "args_before", ()), getattr(p, "args_after", ())
        profiles.append(
            ProfileView(
                name=getattr(p, "profile", ""),
                engine=getattr(p, "engine", ""),
                engine_label=ENGINE_LABELS.get(getattr(p, "engine", ""), getattr(p, "engine", "")),
                args=arg_diff(before, after, getattr(p, "changed_flags", ()) or ()),
                memory=memory_html(("before", getattr(p, "memory_before", None)), ("after", getattr(p, "memory_after", None))),
                restart=restart,
                restart_label=RESTART_LABELS.get(restart, restart),
                refusal=getattr(getattr(p, "refusal", None), "message", ""),
                note=getattr(p, "note", ""),
            )
        )
    return PlanView(
        ok=refusal is None,
        output_only=bool(getattr(plan, "output_only", None)),
        context_before=getattr(plan, "context_before", 0),
        context_after=getattr(plan, "context_after", 0),
        max_output_before=getattr(plan, "max_output_before", 0),
        max_output_after=getattr(plan, "max_output_after", 0),
        trained=getattr(plan, "trained", 0),
        slots=getattr(plan, "slots", 0),
        notes=list(getattr(plan, "notes", ()) or ()),
        refusal_field=getattr(refusal, "field", "") or "",
        refusal=getattr(refusal, "message", "") or "",
        profiles=profiles,
    )


def field_errors(form: ContextForm | None, plan: PlanView | None, error: str = "", preview: bool = False) -> dict[str, str]:
    """One message per form field (and "form" for the rest): the form's own parsing errors,
    else the plan's refusal on the field it concerns. An empty form is not an error while
    the admin types (a preview), only when submitted."""
    errors = {name: "" for name in (*ContextForm.FIELDS, "form")}
    if form is not None and form.is_bound:
        for name, messages in form.errors.items():
            errors[name if name in errors else "form"] = " ".join(messages)
        if preview and form.incomplete:
            errors["form"] = ""
    if plan is not None and plan.refusal:
        where = plan.refusal_field if plan.refusal_field in ContextForm.FIELDS else "form"
        errors[where] = plan.refusal
    if error:
        errors["form"] = error
    return errors


def shape_summary(model: Model) -> list[tuple[str, object]]:
    """The cached shape in words (never read here: the preview reads and caches it)."""
    if not model.shape:
        return []
    try:
        shape = Shape.from_dict(model.shape)
    except (TypeError, ValueError):
        return [("shape", "cached, but not in a form this console reads")]
    rows = [
        ("architecture", shape.architecture),
        ("layers", shape.layers),
        ("heads / KV heads", f"{shape.heads} / {shape.kv_heads}"),
        ("trained context", shape.trained_context or "not known"),
        ("KV per token (f16, full attention)", _bytes(shape.kv_per_token)),
        ("weights", _bytes(shape.weights_bytes) if shape.weights_bytes else "not known"),
    ]
    if shape.sliding_window:
        rows.append(("sliding window", f"{shape.sliding_window} tokens on {sum(shape.swa_layers)} layers"))
    if shape.mla:
        rows.append(("MLA", f"latent {shape.kv_lora_rank} + rope {shape.rope_head_dim}"))
    if any(shape.recurrent_layers):
        rows.append(("recurrent layers", sum(shape.recurrent_layers)))
    if shape.rope_scaling:
        rows.append(("rope scaling", shape.rope_scaling))
    if shape.source_kind:
        rows.append(("read from", shape.source_kind))
    return rows


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def read_log(replica: Replica, lines: int = LOG_LINES) -> str:
    return services.replica_log(replica, lines)


# ----------------------------------------------------------------------------- pages


@require_GET
def model_list(request: HttpRequest) -> HttpResponse:
    active = Change.objects.filter(model=OuterRef("pk"), state__in=[ChangeState.QUEUED, ChangeState.RUNNING])
    models = Model.objects.annotate(
        n_profiles=Count("profiles", distinct=True),
        n_ready=Count("profiles__replicas", filter=Q(profiles__replicas__state=ReplicaState.READY), distinct=True),
        n_replicas=Count("profiles__replicas", filter=live_replicas("profiles__replicas__"), distinct=True),
        active_change_id=Subquery(active.values("pk")[:1]),
        active_change_state=Subquery(active.values("state")[:1]),
    ).order_by("name")
    return render(request, "catalog/model_list.html", {"nav": "models", "models": models})


def _model_page_context(model: Model, user, form: ContextForm, plan=None, error: str = "", conflict=None) -> dict:
    profiles = list(
        model.profiles.select_related("gpu_class").prefetch_related(
            Prefetch(
                "replicas",
                queryset=Replica.objects.filter(live_replicas()).select_related("node").order_by("slot", "id"),
                to_attr="live_replicas",
            )
        )
    )
    changes = list(model.changes.select_related("user")[:15])
    # The memory each profile was last planned with: the latest change that applied a context
    # (a refused one applied nothing; a max-output-only one sized nothing).
    planned = next(
        (c for c in changes if c.state != ChangeState.REFUSED and c.plan and not c.plan.get("output_only")), None
    )
    if planned is None:
        planned = (
            model.changes.exclude(state=ChangeState.REFUSED)
            .exclude(plan__output_only=True)
            .exclude(plan={})
            .only("pk", "created_at", "plan")
            .first()
        )
    memory = {}
    if planned is not None:
        for p in planned.plan.get("profiles") or ():
            memory[p.get("profile")] = memory_html(("planned", _record(p.get("memory_after"))))
    for p in profiles:
        p.memory = memory.get(p.name)
    pv = plan_view(plan)
    return {
        "nav": "models",
        "model": model,
        "profiles": profiles,
        "replicas": [r for p in profiles for r in p.live_replicas],
        "changes": changes,
        "planned": planned,
        "active": next((c for c in changes if c.active), None),
        "shape_rows": shape_summary(model),
        "can_change": services.can_change_context(user),
        **_panel_context(model, form, pv, error=error, conflict=conflict),
    }


def _panel_context(model: Model, form: ContextForm, plan: PlanView | None, *, error="", conflict=None, preview=False):
    errors = field_errors(form, plan, error, preview)
    return {
        "model": model,
        "form": form,
        "fields": [(form[name], errors[name]) for name in ContextForm.FIELDS],
        "plan": plan,
        "errors": errors,
        "conflict": conflict,
    }


@require_GET
def model_detail(request: HttpRequest, name: str) -> HttpResponse:
    model = get_object_or_404(Model, name=name)
    context = _model_page_context(model, request.user, ContextForm(model=model))
    return render(request, "catalog/model_detail.html", context)


@require_POST
def context_preview(request: HttpRequest, name: str) -> HttpResponse:
    """What the change typed so far would do: always 200 with a fragment that says it,
    including for input that is not a number. Writes nothing."""
    form = ContextForm(request.POST)
    plan = error = None
    if form.is_valid():
        try:
            plan = services.preview(name, **form.request_kwargs())
        except services.NotFound as e:
            raise Http404(e.message) from None
        except services.ServiceError as e:
            error = e.message
    # The fragment names the model only in URLs: the service read it, this view need not.
    view = plan_view(plan)
    context = _panel_context(SimpleNamespace(name=name), form, view, error=error or "", preview=True)
    response = render(request, "catalog/model_detail.html#preview", context)
    # The submit button (outside the fragment, there only for those allowed to change) follows
    # the plan: usable when it is complete and accepted.
    label = "Change the longest answer" if view is not None and view.output_only else "Change the context"
    return trigger_client_event(response, "plan-checked", {"ok": bool(view and view.ok), "label": label}, after="swap")


@require_POST
def context_change(request: HttpRequest, name: str) -> HttpResponse:
    """Make the change; without JavaScript, errors re-render the whole page."""
    model = get_object_or_404(Model, name=name)
    if not services.can_change_context(request.user):
        return _forbidden(request, "You may read this model's plan, but changing its context needs the "
                          "change_context permission.")
    form = ContextForm(request.POST, model=model)
    plan = error = conflict = None
    if form.is_valid():
        try:
            change = services.request_change(
                name,
                **form.request_kwargs(),
                message=form.cleaned_data["message"],
                user=request.user,
                source=Source.CONSOLE,
            )
        except services.Refused as e:
            plan, error = e.plan, ("" if e.plan is not None else e.message)
        except services.Conflict as e:
            conflict, error = e.change, e.message
        except services.Forbidden as e:
            return _forbidden(request, e.message)
        except services.NotFound as e:
            raise Http404(e.message) from None
        except services.ServiceError as e:
            error = e.message
        else:
            if request.htmx:
                return HttpResponseClientRedirect(change.get_absolute_url())
            return redirect(change)
    if request.htmx:
        context = _panel_context(model, form, plan_view(plan), error=error or "", conflict=conflict)
        context["can_change"] = True
        return render(request, "catalog/model_detail.html#context_panel", context)
    model.refresh_from_db()
    context = _model_page_context(model, request.user, form, plan, error=error or "", conflict=conflict)
    return render(request, "catalog/model_detail.html", context)


def _forbidden(request: HttpRequest, message: str) -> HttpResponse:
    return render(request, "catalog/forbidden.html", {"message": message}, status=403)


def _change_context(change: Change, user) -> dict:
    steps = list(
        ChangeStep.objects.filter(change=change)
        .select_related("profile", "node", "old_replica", "new_replica__node")
        .order_by("position")
    )
    for step in steps:
        step.log = read_log(step.new_replica) if step.state == "failed" and step.new_replica else ""
    done = sum(1 for s in steps if s.state in ("done", "skipped"))
    current = next((s for s in steps if s.state not in ("done", "skipped", "pending")), None)
    # An error is a sentence, possibly followed by the engine's output: the sentence first.
    error_head, _, error_rest = (change.error or "").strip().partition("\n")
    return {
        "change": change,
        "error_head": error_head,
        "error_rest": error_rest.strip(),
        "plan": plan_view(change.plan),
        "steps": steps,
        "done": done,
        "current": current,
        "can_rollback": change.state == ChangeState.FAILED and services.can_change_context(user),
    }


@require_GET
def change_detail(request: HttpRequest, pk: int) -> HttpResponse:
    change = get_object_or_404(Change.objects.select_related("model", "user", "rollback_of"), pk=pk)
    context = _change_context(change, request.user)
    if request.htmx:
        response = render(request, "catalog/change_detail.html#live", context)
        if not change.active:
            # Ended: the last state is swapped in and the polling stops.
            response = HttpResponseStopPolling(response.content)
        return response
    return render(request, "catalog/change_detail.html", context)


@require_POST
def change_rollback(request: HttpRequest, pk: int) -> HttpResponse:
    change = get_object_or_404(Change, pk=pk)
    try:
        new = services.rollback(change.pk, user=request.user, source=Source.CONSOLE, message=request.POST.get("message", ""))
    except services.Forbidden as e:
        return _forbidden(request, e.message)
    except services.Conflict as e:
        new = e.change
        if new is None:
            return _forbidden(request, e.message)
    except services.ServiceError as e:
        context = _change_context(change, request.user)
        context["rollback_error"] = e.message
        return render(request, "catalog/change_detail.html", context, status=e.status)
    if request.htmx:
        return HttpResponseClientRedirect(new.get_absolute_url())
    return redirect(new)


@require_GET
def change_list(request: HttpRequest) -> HttpResponse:
    """The audit history, filtered by model, user, source and state (GET parameters)."""
    form = HistoryFilterForm(request.GET)
    changes = Change.objects.select_related("model", "user").filter(**form.filters()).order_by("-created_at", "-id")
    page = Paginator(changes, 50).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {"nav": "history", "form": form, "page": page, "query": query.urlencode()}
    template = "catalog/change_list.html#table" if request.htmx else "catalog/change_list.html"
    return render(request, template, context)


@require_GET
def replica_log(request: HttpRequest, pk: int) -> HttpResponse:
    replica = get_object_or_404(Replica.objects.select_related("profile__model", "node"), pk=pk)
    try:
        lines = max(1, min(int(request.GET.get("lines", 200)), 5000))
    except ValueError:
        lines = 200
    return render(request, "catalog/replica_log.html", {"replica": replica, "log": read_log(replica, lines), "lines": lines})
