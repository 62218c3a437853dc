"""Settings, all from the environment (documented in README.md, "Settings")."""

import json
import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value.strip() else default
    except ValueError as e:
        raise ImproperlyConfigured(f"{name} must be a whole number, not {value!r}") from e


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    try:
        return float(value) if value.strip() else default
    except ValueError as e:
        raise ImproperlyConfigured(f"{name} must be a number, not {value!r}") from e


DATA_DIR = Path(os.environ.get("LLMGW_DATA") or BASE_DIR / "var").resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("DEBUG", True)


def _secret_key() -> str:
    key = os.environ.get("SECRET_KEY", "")
    if key:
        return key
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY is required when DEBUG is off")
    path = DATA_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",") if h.strip()]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "catalog",
    "router",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "llmgw_console.urls"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "catalog:model_list"
LOGOUT_REDIRECT_URL = "login"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "llmgw_console.wsgi.application"
ASGI_APPLICATION = "llmgw_console.asgi.application"

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'llmgw.sqlite3'}",
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 0),
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Several processes (web, worker, tests) share the file: wait for locks, don't fail.
    DATABASES["default"].setdefault("OPTIONS", {}).update({"timeout": 30, "transaction_mode": "IMMEDIATE"})

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        "httpx": {"level": "WARNING"},  # one line per engine probe otherwise
        "gguf": {"level": "WARNING"},
    },
}

# --- REST API -----------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "llmgw console API",
    "DESCRIPTION": "The catalog of served models, and safe changes of their context.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema is an API call like the others: a token or a session.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "ENUM_NAME_OVERRIDES": {
        "ChangeStateEnum": "catalog.choices.ChangeState",
        "ReplicaStateEnum": "catalog.choices.ReplicaState",
        "StepStateEnum": "catalog.choices.StepState",
    },
}

# --- Redis and Celery ---------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# The longest a rollout may take; Redis must not hand a task to a second worker before it.
LLMGW_ROLLOUT_TIME_LIMIT = env_int("LLMGW_ROLLOUT_TIME_LIMIT", 6 * 3600)
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = LLMGW_ROLLOUT_TIME_LIMIT
CELERY_TASK_TIME_LIMIT = LLMGW_ROLLOUT_TIME_LIMIT + 300
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": LLMGW_ROLLOUT_TIME_LIMIT + 3600}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = "llmgw"
CELERY_BEAT_SCHEDULE = {
    "reconcile-fleet": {"task": "catalog.tasks.reconcile", "schedule": env_float("LLMGW_RECONCILE_SECONDS", 30.0)},
    "sweep-queued-changes": {"task": "catalog.tasks.sweep_queued_changes", "schedule": env_float("LLMGW_SWEEP_SECONDS", 30.0)},
}

# --- The product ----------------------------------------------------------------
LLMGW_CLUSTER_FILE = os.environ.get("LLMGW_CLUSTER_FILE", "")
# The longest answer a context gets by default: a quarter of it, at most this many tokens.
LLMGW_DEFAULT_MAX_OUTPUT = env_int("LLMGW_DEFAULT_MAX_OUTPUT", 32768)
LLMGW_MIRROR_ROOT = Path(os.environ.get("LLMGW_MIRROR_ROOT") or DATA_DIR / "mirror").resolve()
LLMGW_SHAPE_TIMEOUT = env_float("LLMGW_SHAPE_TIMEOUT", 10.0)
# A shape that could not be read is tried again after this many seconds.
LLMGW_SHAPE_ERROR_TTL = env_float("LLMGW_SHAPE_ERROR_TTL", 60.0)
# How long a process keeps what a preview plans from (catalog/plan_inputs.py); any write to
# the catalog drops it at once. 0: read the catalog on every preview.
LLMGW_PLAN_INPUTS_SECONDS = env_float("LLMGW_PLAN_INPUTS_SECONDS", 1.0)

# Fleet: which backend starts engines, and the command of each engine kind.
LLMGW_FLEET_BACKEND = os.environ.get("LLMGW_FLEET_BACKEND", "local")
LLMGW_ENGINE_COMMANDS = json.loads(os.environ.get("LLMGW_ENGINE_COMMANDS") or "{}")
LLMGW_READY_TIMEOUT = env_float("LLMGW_READY_TIMEOUT", 120.0)
LLMGW_DRAIN_TIMEOUT = env_float("LLMGW_DRAIN_TIMEOUT", 300.0)
LLMGW_PORT_RANGE = (env_int("LLMGW_PORT_MIN", 18000), env_int("LLMGW_PORT_MAX", 18999))

# Router: the largest request body it accepts.
LLMGW_ROUTER_MAX_BODY = env_int("LLMGW_ROUTER_MAX_BODY", 4 << 20)

# fleet: node tasks (catalog.tasks.node_*) return results to the rollout that waits on them;
# every other task keeps ignoring results (CELERY_TASK_IGNORE_RESULT above).
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND") or REDIS_URL
CELERY_RESULT_EXPIRES = 3600
# Engine kinds that run as the stand-in (catalog/fleet/standin.py) instead of the real engine.
LLMGW_STANDIN_ENGINES = [e for e in os.environ.get("LLMGW_STANDIN_ENGINES", "vllm,sglang,strata,freetoken").split(",") if e]
LLMGW_STOP_GRACE = env_float("LLMGW_STOP_GRACE", 10.0)  # SIGTERM → SIGKILL of an engine's process group
LLMGW_ROLLOUT_LOCK_TTL = env_float("LLMGW_ROLLOUT_LOCK_TTL", 15.0)  # a dead worker's rollout resumes after this
LLMGW_SWEEP_GRACE = env_float("LLMGW_SWEEP_GRACE", 60.0)  # a queued change untouched this long is re-enqueued
# The queue rollouts, reconcile and sweeps go to (tests use a private one).
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("LLMGW_CELERY_QUEUE") or CELERY_TASK_DEFAULT_QUEUE
