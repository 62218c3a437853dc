"""What the API takes and gives. Reading serializers read prefetched rows only (the views
prefetch); the context request is checked for types and sizes here and for meaning in
catalog.domain.plan, whose messages the API returns."""

from __future__ import annotations

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from catalog.models import Change, ChangeStep, Model, Profile, Replica

# The largest whole number a request may carry: the database's integer columns hold no more.
INT_MAX = 2**31 - 1
INT_MIN = -(2**31)
MESSAGE_MAX = 2000  # characters of a change's "why"
CONTEXT_REQUEST_DEFAULTS = {"tokens": 0, "slots": 0, "max_output": 0, "message": "", "dry_run": False}


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer, nothing else: no strings ("8192"), no floats (8192.0), no booleans."""

    default_error_messages = {"invalid": "a whole number (a JSON integer) is required"}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    default_error_messages = {"invalid": "true or false is required"}

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class ContextRequestSerializer(serializers.Serializer):
    # Bounds here only keep the numbers sane; the domain refuses what makes no sense
    # (a context under 256, slots outside 0-64, ...) with the seed's messages.
    tokens = StrictIntegerField(
        required=False, default=0, min_value=INT_MIN, max_value=INT_MAX, help_text="tokens one request may use; 0 or absent: keep (longest answer alone)"
    )
    slots = StrictIntegerField(
        required=False, default=0, min_value=INT_MIN, max_value=INT_MAX, help_text="llama.cpp requests at once (1-64); 0: keep each profile's --parallel"
    )
    max_output = StrictIntegerField(
        required=False, default=0, min_value=INT_MIN, max_value=INT_MAX, help_text="longest answer; 0 or absent: follows the context"
    )
    message = serializers.CharField(required=False, default="", allow_blank=True, max_length=MESSAGE_MAX, help_text="why")
    dry_run = StrictBooleanField(required=False, default=False, help_text="plan only, change nothing")


def plain_context_request(data) -> dict | None:
    """ContextRequestSerializer's validated data for the plain request (what the CLI and
    the scripts send on every dry run: known fields, JSON integers in range, a one-line
    message), checked without building a serializer (its fields are rebuilt for each
    request); None for anything else, which the serializer then decides, errors and all.
    tests/api/test_context_request.py checks on generated bodies that the two agree."""
    if type(data) is not dict or not data.keys() <= CONTEXT_REQUEST_DEFAULTS.keys():
        return None
    out = dict(CONTEXT_REQUEST_DEFAULTS)
    for name, value in data.items():
        if name == "message":
            # the serializer strips whitespace and refuses NUL and surrogates: leave those to it
            if type(value) is not str or len(value) > MESSAGE_MAX or value != value.strip() or not value.isprintable():
                return None
        elif name == "dry_run":
            if type(value) is not bool:
                return None
        elif type(value) is not int or not INT_MIN <= value <= INT_MAX:
            return None
        out[name] = value
    return out


class RollbackRequestSerializer(serializers.Serializer):
    message = serializers.CharField(required=False, default="", allow_blank=True, max_length=MESSAGE_MAX, help_text="why")


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()
    field = serializers.CharField(allow_null=True, required=False)
    plan = serializers.JSONField(allow_null=True, required=False)
    errors = serializers.JSONField(required=False, help_text="every field's errors, when the request was malformed")


class ConflictSerializer(ErrorSerializer):
    change_id = serializers.IntegerField(allow_null=True)
    url = serializers.URLField(allow_null=True)


def change_url(request, change_id: int) -> str:
    path = reverse("api:change-detail", args=[change_id])
    return request.build_absolute_uri(path) if request is not None else path


class ChangeSummarySerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()

    class Meta:
        model = Change
        fields = ["id", "url", "kind", "state", "created_at"]

    @extend_schema_field(OpenApiTypes.URI)
    def get_url(self, obj) -> str:
        return change_url(self.context.get("request"), obj.pk)


def _current(model) -> Change | None:
    active = getattr(model, "active_changes", None)
    return active[0] if active else None


class ModelListSerializer(serializers.ModelSerializer):
    profiles_count = serializers.IntegerField(read_only=True)
    replicas_ready = serializers.IntegerField(read_only=True)
    replicas_total = serializers.IntegerField(read_only=True)
    current_change = serializers.SerializerMethodField(help_text="the change queued or running, if any")
    url = serializers.SerializerMethodField()

    class Meta:
        model = Model
        fields = [
            "name",
            "url",
            "source",
            "context_length",
            "max_output",
            "declared",
            "profiles_count",
            "replicas_ready",
            "replicas_total",
            "current_change",
        ]

    @extend_schema_field(OpenApiTypes.URI)
    def get_url(self, obj) -> str:
        path = reverse("api:model-detail", args=[obj.name])
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request is not None else path

    @extend_schema_field(ChangeSummarySerializer(allow_null=True))
    def get_current_change(self, obj):
        current = _current(obj)
        return ChangeSummarySerializer(current, context=self.context).data if current else None


class ReplicaSerializer(serializers.ModelSerializer):
    profile = serializers.CharField(source="profile.name")
    node = serializers.CharField(source="node.name")
    log_url = serializers.SerializerMethodField()

    class Meta:
        model = Replica
        fields = ["id", "profile", "node", "slot", "state", "endpoint", "pid", "args", "started_at", "stopped_at",
                  "error", "log_url"]

    def get_log_url(self, replica) -> str:
        url = reverse("api:replica-log", args=[replica.pk])
        request = self.context.get("request")
        return request.build_absolute_uri(url) if request is not None else url


class ReplicaLogSerializer(serializers.Serializer):
    replica = serializers.IntegerField()
    lines = serializers.IntegerField(help_text="how many of the last lines were asked for")
    log = serializers.CharField(help_text="the engine's output (its command line first, when the log is short)")


class ProfileSerializer(serializers.ModelSerializer):
    gpu_class = serializers.CharField(source="gpu_class.name", allow_null=True, default=None)
    args = serializers.ListField(child=serializers.CharField())

    class Meta:
        model = Profile
        fields = ["name", "engine", "args", "gpu_class", "gpus_per_node", "tp", "pp", "nodes", "cpu_only", "min_memory_gb"]


class ShapeSerializer(serializers.Serializer):
    """The cached shape as catalog.shapes stored it (never read here: reading is I/O)."""

    data = serializers.JSONField(allow_null=True, source="shape")
    error = serializers.CharField(source="shape_error")
    read_at = serializers.DateTimeField(source="shape_read_at", allow_null=True)


class ModelDetailSerializer(ModelListSerializer):
    origin_repo = serializers.CharField()
    origin_revision = serializers.CharField()
    weights_bytes = serializers.SerializerMethodField()
    profiles = ProfileSerializer(many=True, read_only=True)
    replicas = serializers.SerializerMethodField()
    shape = ShapeSerializer(source="*", read_only=True)
    recent_changes = serializers.SerializerMethodField()

    class Meta(ModelListSerializer.Meta):
        fields = ModelListSerializer.Meta.fields + [
            "origin_repo",
            "origin_revision",
            "weights_bytes",
            "profiles",
            "replicas",
            "shape",
            "recent_changes",
        ]

    def get_weights_bytes(self, obj) -> int:
        return sum(f.size for f in obj.files.all())

    @extend_schema_field(ReplicaSerializer(many=True))
    def get_replicas(self, obj):
        replicas = [r for p in obj.profiles.all() for r in p.replicas.all()]
        return ReplicaSerializer(replicas, many=True, context=self.context).data

    @extend_schema_field(ChangeSummarySerializer(many=True))
    def get_recent_changes(self, obj):
        return ChangeSummarySerializer(getattr(obj, "recent_changes", []), many=True, context=self.context).data


class ChangeStepSerializer(serializers.ModelSerializer):
    profile = serializers.CharField(source="profile.name")
    node = serializers.CharField(source="node.name")
    old_replica = serializers.IntegerField(source="old_replica_id", allow_null=True)
    new_replica = serializers.IntegerField(source="new_replica_id", allow_null=True)

    class Meta:
        model = ChangeStep
        fields = ["position", "profile", "node", "policy", "state", "detail", "old_replica", "new_replica", "started_at", "finished_at"]


class ProgressSerializer(serializers.Serializer):
    done = serializers.IntegerField(help_text="replicas restarted (or skipped) so far: k of n")
    total = serializers.IntegerField(help_text="replicas to restart: n")
    current = serializers.IntegerField(allow_null=True, help_text="position of the step in progress")


FINISHED_STEPS = {"done", "skipped"}


class ChangeSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()
    model = serializers.CharField(source="model.name")
    user = serializers.CharField(source="user.get_username", allow_null=True, default=None)
    rollback_of = serializers.IntegerField(source="rollback_of_id", allow_null=True)
    steps = ChangeStepSerializer(many=True, read_only=True)
    progress = serializers.SerializerMethodField()

    class Meta:
        model = Change
        fields = [
            "id",
            "url",
            "model",
            "kind",
            "state",
            "user",
            "source",
            "message",
            "request",
            "before",
            "after",
            "plan",
            "error",
            "rollback_of",
            "created_at",
            "started_at",
            "finished_at",
            "progress",
            "steps",
        ]

    @extend_schema_field(OpenApiTypes.URI)
    def get_url(self, obj) -> str:
        return change_url(self.context.get("request"), obj.pk)

    @extend_schema_field(ProgressSerializer)
    def get_progress(self, obj):
        steps = list(obj.steps.all())
        current = next((s.position for s in steps if s.state not in FINISHED_STEPS and s.state != "pending"), None)
        return {"done": sum(1 for s in steps if s.state in FINISHED_STEPS), "total": len(steps), "current": current}


class PlanResultSerializer(serializers.Serializer):
    dry_run = serializers.BooleanField()
    plan = serializers.JSONField(help_text="the plan: context and longest answer before → after, each profile's args and memory, notes")
    change = ChangeSerializer(allow_null=True, help_text="the change made (a longest-answer-only change), or null for a dry run")
