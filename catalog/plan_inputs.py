"""What a plan of a model needs from the catalog, kept in each process between previews.

The live preview (console and API dry run) plans on every keystroke. What it plans from
changes far less often: the model, its profiles with their GPU classes, whether their nodes
have room for a second copy (the fleet's one query over replicas and nodes), the cached
shape and its note. Reading those costs four queries, most of a preview's time; this
module keeps them per model name.

Freshness. Every save or delete of a model, profile, GPU class, node, replica or origin file
(and the few writes that skip signals, which call `catalog_changed` themselves) drops what
this process keeps at once, and publishes `llmgw:catalog:changed` on Redis twice: at the
save, and again once the transaction commits, so that no process keeps what it read in
between. Each process listens to that channel in a thread and drops what it keeps on every
message, so a preview costs no round trip to learn that nothing changed. An entry is used
only while no change was seen since it was read, and for at most
`LLMGW_PLAN_INPUTS_SECONDS` (default 1 s; 0 turns this off): whatever a message cannot
reach (a write that calls nothing, a network that drops silently) is seen within that.
While the listener is not subscribed (Redis down, or starting), nothing is kept and every
preview reads the catalog.

Only previews read through here. `services.request_change` plans from rows it reads under
the model's lock, so a stale entry can only show a plan a moment old, never apply one."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)

CHANNEL = "llmgw:catalog:changed"
RETRY_SECONDS = 2.0  # between two attempts to subscribe, and to publish after a failure
MAX_ENTRIES = 1000

T = TypeVar("T")

_entries: dict[str, tuple[float, int, object]] = {}  # name → (expires, generation, inputs)
_lock = threading.Lock()
_generation = 0  # one more for every change seen, this process's own at once
_listening = False  # subscribed: other processes' changes reach this one
_listener: object | None = None  # the token of the thread that listens (None: none started)
_publisher: dict = {}
_publish_failed_at = 0.0


def _seen_change() -> None:
    global _generation
    with _lock:
        _generation += 1


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads: it forgets their listener and what
    it kept (its first preview starts its own), and takes a fresh lock (another thread may
    have held the parent's as it forked)."""
    global _lock, _listener, _listening
    _lock = threading.Lock()
    _listener = None
    _listening = False
    _entries.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def cached(name: str, load: Callable[[], T]) -> T:
    """The inputs of model `name`: the kept ones while no change was seen since they were
    read, else load()'s (which may raise; nothing is kept then)."""
    ttl = float(settings.LLMGW_PLAN_INPUTS_SECONDS)
    if ttl <= 0:
        return load()
    if _listener is None:
        _start_listener()
    if not _listening:
        return load()
    generation = _generation  # before reading: a change during load() makes this entry old
    now = time.monotonic()
    entry = _entries.get(name)
    if entry is not None and entry[1] == generation and entry[0] > now:
        return entry[2]  # type: ignore[return-value]
    value = load()
    if len(_entries) >= MAX_ENTRIES:
        _entries.clear()
    _entries[name] = (now + ttl, generation, value)
    return value


def clear() -> None:
    """Forget every kept entry of this process."""
    _entries.clear()


def catalog_changed(sender=None, **kwargs) -> None:
    """A signal receiver (and a call for writes that skip signals): what this process keeps
    is dropped now; every process is told now and again once the transaction commits."""
    _publish()
    transaction.on_commit(_publish, robust=True)


def _publish() -> None:
    global _publish_failed_at
    _seen_change()
    if time.monotonic() - _publish_failed_at < RETRY_SECONDS:
        return  # Redis was just found down: the others' entries expire on their own
    try:
        key = (os.getpid(), settings.REDIS_URL)
        client = _publisher.get(key)
        if client is None:
            import redis

            client = _publisher[key] = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5)
        client.publish(CHANNEL, b"")
    except Exception:  # noqa: BLE001 - redis-py raises its own errors and the socket's
        _publish_failed_at = time.monotonic()
        log.warning("catalog: could not tell other processes that the catalog changed (their previews "
                    "catch up within %s s)", settings.LLMGW_PLAN_INPUTS_SECONDS, exc_info=True)


def _start_listener() -> None:
    global _listener, _listening
    with _lock:
        if _listener is not None:
            return
        token = _listener = object()
        _listening = False
    thread = threading.Thread(target=_listen, args=(settings.REDIS_URL, token), name="llmgw-catalog-changes", daemon=True)
    thread.start()


def stop_listening() -> None:
    """Stop this process's listener (the next preview starts another, with the settings of
    then) and forget what it kept."""
    global _listener, _listening
    with _lock:
        _listener = None
        _listening = False
        _entries.clear()


def _current(token: object) -> bool:
    return _listener is token


def _listen(url: str, token: object) -> None:
    """Subscribe, and count every message as a change, while this thread is the listener."""
    global _listening
    import redis

    quiet_since = 0.0
    while _current(token):
        pubsub = None
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10, health_check_interval=5)
            pubsub = client.pubsub()
            pubsub.subscribe(CHANNEL)
            while _current(token):
                message = pubsub.get_message(timeout=1.0)  # pings every 5 s: a dead link fails here
                if message is None:
                    continue
                _seen_change()  # a change, or the subscription itself: entries from before are old
                if message["type"] == "subscribe":
                    with _lock:
                        if _current(token):
                            _listening = True
                    quiet_since = 0.0
        except Exception:  # noqa: BLE001
            if not quiet_since:
                log.warning("catalog: not listening for catalog changes (Redis at %s); previews read the "
                            "catalog every time until it is back", url, exc_info=True)
                quiet_since = time.monotonic()
        finally:
            with _lock:
                if _current(token):
                    _listening = False
            _seen_change()
            if pubsub is not None:
                try:
                    pubsub.close()
                except Exception:  # noqa: BLE001
                    pass
        if _current(token):
            time.sleep(RETRY_SECONDS)
