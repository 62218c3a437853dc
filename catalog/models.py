"""The catalog (SPEC §2): served models, their profiles, the cards and machines, the
replicas that run, and the changes made to a model's context."""

from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.urls import reverse

from .choices import ChangeKind, ChangeState, Engine, ReplicaState, RestartPolicy, Source, StepState

name_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._:-]*$", "letters, digits, and . _ : - (not first)"
)


class GPUClass(models.Model):
    """A kind of card: its memory, and how much of it an engine may use (as data, with sources)."""

    name = models.CharField(max_length=64, unique=True, validators=[name_validator])
    memory_gb = models.FloatField(validators=[MinValueValidator(0)], help_text="card memory, GiB")
    usable_gb = models.FloatField(validators=[MinValueValidator(0)], help_text="what an engine can use, GiB")
    source = models.TextField(help_text="where the figures come from")

    class Meta:
        ordering = ["name"]
        verbose_name = "GPU class"
        verbose_name_plural = "GPU classes"
        constraints = [
            models.CheckConstraint(condition=Q(memory_gb__gte=0) & Q(usable_gb__gte=0), name="gpuclass_sizes_nonnegative"),
            models.CheckConstraint(condition=Q(usable_gb__lte=models.F("memory_gb")), name="gpuclass_usable_within_memory"),
        ]

    def __str__(self):
        return self.name


class Model(models.Model):
    """A served model."""

    name = models.CharField(max_length=128, unique=True, validators=[name_validator])
    source = models.CharField(max_length=1000, blank=True, help_text="GGUF URL on the mirror, or a .gguf path under the mirror root")
    origin_repo = models.CharField(max_length=200, blank=True, help_text="Hugging Face repo of the original weights")
    origin_revision = models.CharField(max_length=100, blank=True, default="")
    context_length = models.PositiveIntegerField(default=0, help_text="tokens one request may use")
    max_output = models.PositiveIntegerField(default=0, help_text="longest answer in tokens; 0 = no limit")
    declared = models.BooleanField(default=False, help_text="from the cluster file: read-only here")
    # The shape (catalog.domain.kv.Shape as a dict), cached with what it was read from.
    shape = models.JSONField(null=True, blank=True, editable=False)
    shape_key = models.CharField(max_length=2000, blank=True, editable=False)
    shape_error = models.TextField(blank=True, editable=False)
    shape_read_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        permissions = [("change_context", "Can change a model's context and longest answer")]

    def __str__(self):
        return self.name

    def get_absolute_url(self):
        return reverse("catalog:model_detail", args=[self.name])

    @property
    def weights_bytes(self) -> int:
        return sum(f.size for f in self.files.all())


class OriginFile(models.Model):
    """One file of a model's original weights, with its size in bytes."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="files")
    path = models.CharField(max_length=500)
    size = models.PositiveBigIntegerField()

    class Meta:
        ordering = ["path"]
        constraints = [models.UniqueConstraint(fields=["model", "path"], name="originfile_unique_path")]

    def __str__(self):
        return self.path


class Profile(models.Model):
    """How one engine serves a model."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="profiles")
    name = models.CharField(max_length=64, validators=[name_validator])
    engine = models.CharField(max_length=16, choices=Engine.choices)
    args = models.JSONField(default=list, blank=True, help_text="arguments, exactly as the engine gets them")
    gpu_class = models.ForeignKey(GPUClass, null=True, blank=True, on_delete=models.PROTECT, related_name="profiles")
    gpus_per_node = models.PositiveIntegerField(default=0)
    tp = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    pp = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    nodes = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    cpu_only = models.BooleanField(default=False)
    min_memory_gb = models.PositiveIntegerField(default=0, help_text="RAM a CPU-only replica needs, GB")

    class Meta:
        ordering = ["model", "name"]
        constraints = [
            models.UniqueConstraint(fields=["model", "name"], name="profile_unique_name"),
            models.CheckConstraint(condition=Q(engine__in=Engine.values), name="profile_engine_known"),
            models.CheckConstraint(condition=Q(tp__gte=1) & Q(pp__gte=1) & Q(nodes__gte=1), name="profile_parallel_positive"),
        ]

    def __str__(self):
        return f"{self.model.name}/{self.name}"


class Node(models.Model):
    """A machine that runs replicas."""

    name = models.CharField(max_length=64, unique=True, validators=[name_validator])
    host = models.CharField(max_length=255, default="127.0.0.1", help_text="address its engines listen on")
    gpu_class = models.ForeignKey(GPUClass, null=True, blank=True, on_delete=models.PROTECT, related_name="nodes")
    gpu_count = models.PositiveIntegerField(default=0)
    ram_gb = models.PositiveIntegerField(default=0)
    backend = models.CharField(max_length=16, default="local", help_text="local, or celery (a worker on queue node.<name>)")

    class Meta:
        ordering = ["name"]
        constraints = [models.CheckConstraint(condition=Q(backend__in=["local", "celery"]), name="node_backend_known")]

    def __str__(self):
        return self.name

    @property
    def queue(self) -> str:
        return f"node.{self.name}"


class Replica(models.Model):
    """One engine process of one profile on one node."""

    profile = models.ForeignKey(Profile, on_delete=models.CASCADE, related_name="replicas")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="replicas")
    slot = models.PositiveIntegerField(default=0, help_text="which of the profile's replicas on this node it stands for")
    endpoint = models.CharField(max_length=255, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    args = models.JSONField(default=list, blank=True)
    state = models.CharField(max_length=16, choices=ReplicaState.choices, default=ReplicaState.STARTING)
    log_path = models.CharField(max_length=1000, blank=True)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["profile", "slot", "id"]
        constraints = [models.CheckConstraint(condition=Q(state__in=ReplicaState.values), name="replica_state_known")]
        indexes = [models.Index(fields=["state"])]

    def __str__(self):
        return f"{self.profile} #{self.slot} on {self.node} ({self.state})"


class Change(models.Model):
    """One context or longest-answer change of a model, with who, why and what it did."""

    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="changes")
    kind = models.CharField(max_length=16, choices=ChangeKind.choices)
    state = models.CharField(max_length=16, choices=ChangeState.choices, default=ChangeState.QUEUED)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    source = models.CharField(max_length=16, choices=Source.choices)
    message = models.TextField(blank=True)
    request = models.JSONField(default=dict, help_text="what was asked: tokens, slots, max_output")
    before = models.JSONField(default=dict, help_text="context, longest answer, and each profile's args and memory")
    after = models.JSONField(default=dict)
    plan = models.JSONField(default=dict, help_text="the plan shown before the change was made")
    error = models.TextField(blank=True)
    rollback_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="rollbacks")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=ChangeState.values), name="change_state_known"),
            models.CheckConstraint(condition=Q(source__in=Source.values), name="change_source_known"),
            # One change per model runs at once: the database says so, too.
            models.UniqueConstraint(
                fields=["model"], condition=Q(state__in=["queued", "running"]), name="change_one_active_per_model"
            ),
        ]
        indexes = [models.Index(fields=["state"])]

    def __str__(self):
        return f"change {self.pk} of {self.model.name} ({self.state})"

    def get_absolute_url(self):
        return reverse("catalog:change_detail", args=[self.pk])

    @property
    def active(self) -> bool:
        return self.state in (ChangeState.QUEUED, ChangeState.RUNNING)


class ChangeStep(models.Model):
    """The restart of one replica during a change's rollout."""

    change = models.ForeignKey(Change, on_delete=models.CASCADE, related_name="steps")
    position = models.PositiveIntegerField()
    profile = models.ForeignKey(Profile, on_delete=models.CASCADE, related_name="+")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="+")
    old_replica = models.ForeignKey(Replica, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    new_replica = models.ForeignKey(Replica, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    policy = models.CharField(max_length=16, choices=RestartPolicy.choices, default=RestartPolicy.SURGE)
    state = models.CharField(max_length=16, choices=StepState.choices, default=StepState.PENDING)
    detail = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["change", "position"]
        constraints = [models.UniqueConstraint(fields=["change", "position"], name="changestep_unique_position")]

    def __str__(self):
        return f"step {self.position} of {self.change}"
