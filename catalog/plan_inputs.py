"""What a plan of a model needs from the catalog, kept in each process between previews.

The live preview (console and API dry run) plans on every keystroke. What it plans from
changes far less often: the model, its profiles with their GPU classes, whether their nodes
have room for a second copy (the fleet's one query over replicas and nodes), the cached
shape and its note. Reading those costs four queries, most of a preview's time; this
module keeps them per model name.

Freshness. Every save or delete of a model, profile, GPU class, node, replica or origin file
increments `llmgw:catalog:version` in Redis twice: at the save, so that a transaction sees
its own writes, and once the transaction commits, so that no process keeps what it read in
between. An entry is used only while the version is the one read before it was loaded, and
for at most `LLMGW_PLAN_INPUTS_SECONDS` (default 1 s; 0 turns this cache off): a write that
skips signals (`QuerySet.update`) is seen within that. When Redis cannot answer, nothing is
cached and every preview reads the catalog (Redis is tried again after 5 s).

Only previews read through it. `services.request_change` plans from rows it reads under
the model's lock, so a stale entry can only show a plan a moment old, never apply one."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)

VERSION_KEY = "llmgw:catalog:version"
REDIS_RETRY_SECONDS = 5.0
MAX_ENTRIES = 1000

T = TypeVar("T")

_entries: dict[str, tuple[float, bytes, object]] = {}  # name → (expires, version, inputs)
_clients: dict = {}
_redis_down_until = 0.0


def _redis():
    import redis

    key = (os.getpid(), settings.REDIS_URL)
    client = _clients.get(key)
    if client is None:
        # Short timeouts: a preview must not wait on a Redis that hangs.
        client = _clients[key] = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5)
    return client


def _redis_failed(doing: str) -> None:
    global _redis_down_until
    if time.monotonic() >= _redis_down_until:
        log.warning("catalog version: Redis could not %s; previews read the catalog every time for %.0f s",
                    doing, REDIS_RETRY_SECONDS, exc_info=True)
    _redis_down_until = time.monotonic() + REDIS_RETRY_SECONDS


def _version() -> bytes | None:
    """The catalog's version, or None when it cannot be known (nothing is cached then)."""
    if time.monotonic() < _redis_down_until:
        return None
    try:
        return _redis().get(VERSION_KEY) or b"0"
    except Exception:  # noqa: BLE001 - redis-py raises its own errors and the socket's
        _redis_failed("be read")
        return None


def cached(name: str, load: Callable[[], T]) -> T:
    """The inputs of model `name`: kept ones while the catalog has not changed, else load()'s
    (which may raise; nothing is kept then)."""
    ttl = float(settings.LLMGW_PLAN_INPUTS_SECONDS)
    version = _version() if ttl > 0 else None
    if version is None:
        return load()
    now = time.monotonic()
    entry = _entries.get(name)
    if entry is not None and entry[0] > now and entry[1] == version:
        return entry[2]  # type: ignore[return-value]
    value = load()
    if len(_entries) >= MAX_ENTRIES:
        _entries.clear()
    _entries[name] = (now + ttl, version, value)
    return value


def clear() -> None:
    """Forget every kept entry of this process."""
    _entries.clear()


def bump() -> None:
    """Increment the catalog's version: every process reads its inputs again."""
    if time.monotonic() < _redis_down_until:
        return
    try:
        _redis().incr(VERSION_KEY)
    except Exception:  # noqa: BLE001
        _redis_failed("be written")


def catalog_changed(sender=None, **kwargs) -> None:
    """A signal receiver (and a call for writes that skip signals): bump now, and again on commit."""
    bump()
    transaction.on_commit(bump, robust=True)
