"""The REST API (SPEC §7): thin views over catalog.services.

Reading needs a login (token or session); changing needs `catalog.change_context`. Every
error is JSON with a `detail` (the seed's message where it has one) and, where a field is
at fault, its `field`."""

from __future__ import annotations

from django.db.models import Count, Prefetch, Q
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import generics, status
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import APIView

from catalog import services
from catalog.choices import ReplicaState, Source
from catalog.models import Change, ChangeStep, Model, Profile, Replica

from .serializers import (
    ChangeSerializer,
    ConflictSerializer,
    ContextRequestSerializer,
    ErrorSerializer,
    ModelDetailSerializer,
    ModelListSerializer,
    PlanResultSerializer,
    ReplicaLogSerializer,
    RollbackRequestSerializer,
    change_url,
    plain_context_request,
)

SOURCE_HEADER = "HTTP_X_LLMGW_SOURCE"
SOURCE_PARAMETER = OpenApiParameter(
    "X-LLMGW-Source",
    str,
    OpenApiParameter.HEADER,
    required=False,
    enum=["api", "cli"],
    description="who is asking: `cli` for the llmgw command, else `api` (the default)",
)
RECENT_CHANGES = 10


def _source(request) -> str:
    value = (request.META.get(SOURCE_HEADER) or "").strip().lower()
    return Source.CLI if value == Source.CLI else Source.API


def _active_changes():
    return Prefetch(
        "changes",
        queryset=Change.objects.filter(state__in=services.ACTIVE_STATES).order_by("created_at", "id"),
        to_attr="active_changes",
    )


def _changes():
    return Change.objects.select_related("model", "user").prefetch_related(
        Prefetch("steps", queryset=ChangeStep.objects.select_related("profile", "node").order_by("position"))
    )


def _error(status_code: int, detail: str, *, field: str | None = None, plan=None, **extra) -> Response:
    body = {"detail": detail, "field": field, "plan": plan}
    body.update(extra)
    return Response(body, status=status_code)


def _service_error(request, e: services.ServiceError) -> Response:
    if isinstance(e, services.Conflict):
        active = e.change
        return _error(
            status.HTTP_409_CONFLICT,
            e.message,
            field=e.field,
            change_id=active.pk if active else None,
            url=change_url(request, active.pk) if active else None,
        )
    plan = e.plan.to_dict() if isinstance(e, services.Refused) and e.plan is not None else None
    return _error(e.status, e.message, field=e.field, plan=plan)


def _invalid(errors) -> Response:
    """A malformed request: the first field at fault, its first message, and all of them."""
    if isinstance(errors, dict) and errors:
        field, messages = next(iter(errors.items()))
        message = messages[0] if isinstance(messages, list) and messages else str(messages)
        field = None if field == "non_field_errors" else field
        detail = f"{field}: {message}" if field else str(message)
        return _error(status.HTTP_400_BAD_REQUEST, detail, field=field or "body", errors=errors)
    return _error(status.HTTP_400_BAD_REQUEST, "the request's body is not valid", field="body", errors=errors)


def _data(request):
    """The body, or None when it is not JSON (ParseError)."""
    try:
        return request.data, None
    except ParseError as e:
        return None, _error(status.HTTP_400_BAD_REQUEST, f"the request's body is not valid JSON: {e.detail}", field="body")


def _change_response(request, change: Change, *, plan: dict | None) -> Response:
    """202 with the queued change (and where to follow it), or 200 for a change already done."""
    change = _changes().get(pk=change.pk)
    data = ChangeSerializer(change, context={"request": request}).data
    if change.active:
        return Response(data, status=status.HTTP_202_ACCEPTED, headers={"Location": data["url"]})
    return Response(PlanResultSerializer({"dry_run": False, "plan": plan or change.plan, "change": change}, context={"request": request}).data)


ERRORS = {
    400: OpenApiResponse(ErrorSerializer, description="refused, or a malformed request: `detail` says why, `field` which"),
    401: OpenApiResponse(ErrorSerializer, description="not logged in (token or session)"),
    403: OpenApiResponse(ErrorSerializer, description="not allowed to change contexts"),
    404: OpenApiResponse(ErrorSerializer, description="no such model"),
    409: OpenApiResponse(ConflictSerializer, description="another change of the model is queued or running"),
}


READ_ERRORS = {401: ERRORS[401], 404: OpenApiResponse(ErrorSerializer, description="no such object (or page)")}


@extend_schema_view(get=extend_schema(responses={200: ModelListSerializer(many=True), **READ_ERRORS}))
class ModelList(generics.ListAPIView):
    """The served models: context, longest answer, profiles, replicas ready of total, current change."""

    serializer_class = ModelListSerializer

    def get_queryset(self):
        return _models()


def _models():
    """Models with their counts and current change, in a fixed number of queries."""
    return (
        Model.objects.annotate(
            profiles_count=Count("profiles", distinct=True),
            replicas_total=Count("profiles__replicas", distinct=True),
            replicas_ready=Count("profiles__replicas", filter=Q(profiles__replicas__state=ReplicaState.READY), distinct=True),
        )
        .prefetch_related(_active_changes())
        .order_by("name")
    )


@extend_schema_view(get=extend_schema(responses={200: ModelDetailSerializer, **READ_ERRORS}))
class ModelDetail(generics.RetrieveAPIView):
    """A model: its profiles with their args, its replicas, its cached shape, its changes."""

    serializer_class = ModelDetailSerializer
    lookup_field = "name"

    def get_queryset(self):
        return _models().prefetch_related(
            "files",
            Prefetch(
                "profiles",
                queryset=Profile.objects.select_related("gpu_class")
                .prefetch_related(Prefetch("replicas", queryset=Replica.objects.select_related("node", "profile")))
                .order_by("name"),
            ),
            Prefetch("changes", queryset=Change.objects.order_by("-created_at", "-id")[:RECENT_CHANGES], to_attr="recent_changes"),
        )


class ModelContext(APIView):
    """Change a model's context (and longest answer), or its longest answer alone; or, with
    `dry_run`, only see the plan. Reading the plan needs a login; changing needs
    `catalog.change_context`."""

    parser_classes = [JSONParser]

    @extend_schema(
        operation_id="models_context_change",
        request=ContextRequestSerializer,
        parameters=[SOURCE_PARAMETER],
        responses={
            200: OpenApiResponse(PlanResultSerializer, description="the plan (dry run), or a longest-answer-only change, done"),
            202: OpenApiResponse(ChangeSerializer, description="the change, queued; `Location` and `url` say where to follow it"),
            **ERRORS,
        },
    )
    def post(self, request, name: str):
        data, bad = _data(request)
        if bad is not None:
            return bad
        v = plain_context_request(data)
        if v is None:
            form = ContextRequestSerializer(data=data)
            if not form.is_valid():
                return _invalid(form.errors)
            v = form.validated_data
        numbers = {"tokens": v["tokens"], "slots": v["slots"], "max_output": v["max_output"]}
        try:
            if v["dry_run"]:
                plan = services.preview(name, **numbers)
                if plan.refusal is not None:
                    r = plan.refusal
                    return _error(r.status, r.message, field=r.field, plan=plan.to_dict() if r.status != 404 else None)
                return Response({"dry_run": True, "plan": plan.to_dict(), "change": None})  # PlanResultSerializer's form
            change = services.request_change(name, **numbers, message=v["message"], user=request.user, source=_source(request))
        except services.ServiceError as e:
            return _service_error(request, e)
        return _change_response(request, change, plan=None)


@extend_schema_view(get=extend_schema(responses={200: ChangeSerializer, **READ_ERRORS}))
class ChangeDetail(generics.RetrieveAPIView):
    """A change: who, why, from where, before and after, the plan, and the rollout's progress
    (replica k of n, each step's state)."""

    serializer_class = ChangeSerializer

    def get_queryset(self):
        return _changes()


class ChangeRollback(APIView):
    """Roll a change back: a new change to the context, slots and longest answer it changed from."""

    parser_classes = [JSONParser]

    @extend_schema(
        operation_id="changes_rollback",
        request=RollbackRequestSerializer,
        parameters=[SOURCE_PARAMETER],
        responses={
            200: OpenApiResponse(PlanResultSerializer, description="a longest-answer-only rollback, done"),
            202: OpenApiResponse(ChangeSerializer, description="the rollback, queued"),
            **ERRORS,
        },
    )
    def post(self, request, pk: int):
        data, bad = _data(request)
        if bad is not None:
            return bad
        form = RollbackRequestSerializer(data=data if data is not None else {})
        if not form.is_valid():
            return _invalid(form.errors)
        try:
            change = services.rollback(pk, user=request.user, source=_source(request), message=form.validated_data["message"])
        except services.ServiceError as e:
            return _service_error(request, e)
        return _change_response(request, change, plan=None)


class ReplicaLog(APIView):
    """A replica's last engine log lines (`lines`, default 50, at most 5000), read where the
    replica runs."""

    @extend_schema(
        operation_id="replicas_log",
        parameters=[OpenApiParameter("lines", int, OpenApiParameter.QUERY, required=False, description="1 to 5000; default 50")],
        responses={200: ReplicaLogSerializer, 400: ERRORS[400], **READ_ERRORS},
    )
    def get(self, request, pk: int):
        replica = Replica.objects.select_related("node").filter(pk=pk).first()
        if replica is None:
            return _error(status.HTTP_404_NOT_FOUND, f"no replica {pk}")
        raw = request.query_params.get("lines", "50")
        try:
            lines = int(raw)
        except ValueError:
            lines = 0
        if not 1 <= lines <= services.LOG_LINES_MAX:
            return _error(status.HTTP_400_BAD_REQUEST, f"lines is a whole number from 1 to {services.LOG_LINES_MAX}, not {raw!r}", field="lines")
        return Response({"replica": replica.pk, "lines": lines, "log": services.replica_log(replica, lines)})
