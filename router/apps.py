"""The router's app. Its one hook: whenever a replica, a model or a key is saved or deleted
(anywhere: the console, the API, a Celery worker's rollout), `llmgw:routes:version` is bumped
in Redis once the change is committed, and every router process drops its cached routes
before it picks its next replica (router/gateway.py explains why that is race-free)."""

import logging

from django.apps import AppConfig

log = logging.getLogger("llmgw.router")


class RouterConfig(AppConfig):
    name = "router"
    verbose_name = "Router"

    def ready(self):
        from django.db.models.signals import m2m_changed, post_delete, post_save

        from catalog.models import Model, Replica

        from .models import ApiKey

        for sender in (Replica, Model, ApiKey):
            post_save.connect(routes_changed, sender=sender, dispatch_uid=f"llmgw-routes-save-{sender.__name__}")
            post_delete.connect(routes_changed, sender=sender, dispatch_uid=f"llmgw-routes-delete-{sender.__name__}")
        m2m_changed.connect(routes_changed, sender=ApiKey.models.through, dispatch_uid="llmgw-routes-key-models")


def routes_changed(sender, **kwargs):
    from django.db import transaction

    transaction.on_commit(bump_routes_version, robust=True)


_redis = {}


def bump_routes_version() -> None:
    from django.conf import settings

    from .gateway import ROUTES_VERSION_KEY

    url = getattr(settings, "LLMGW_ROUTER_REDIS_URL", None) or settings.REDIS_URL
    try:
        import redis

        client = _redis.get(url)
        if client is None:
            client = _redis[url] = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        client.incr(ROUTES_VERSION_KEY)
    except Exception:  # the routers' cache then expires on its own within a second
        log.warning("router: could not bump %s", ROUTES_VERSION_KEY, exc_info=True)
