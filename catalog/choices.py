from django.db import models


class Engine(models.TextChoices):
    LLAMACPP = "llamacpp", "llama.cpp"
    VLLM = "vllm", "vLLM"
    SGLANG = "sglang", "SGLang"
    STRATA = "strata", "strata"
    FREETOKEN = "freetoken", "freetoken"


class ReplicaState(models.TextChoices):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


class ChangeState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back", "rolled back"
    REFUSED = "refused"


class ChangeKind(models.TextChoices):
    CONTEXT = "context"
    MAX_OUTPUT = "max_output", "longest answer"
    ROLLBACK = "rollback"


class Source(models.TextChoices):
    CONSOLE = "console"
    API = "api", "API"
    CLI = "cli", "CLI"
    ADMIN = "admin"


class StepState(models.TextChoices):
    PENDING = "pending"
    STARTING = "starting"
    DRAINING = "draining"
    DONE = "done"
    SKIPPED = "skipped"
    FAILED = "failed"


class RestartPolicy(models.TextChoices):
    SURGE = "surge", "new before old"
    IN_PLACE = "in_place", "in place"
