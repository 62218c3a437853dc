"""The router's work, whatever serves it: key check, body check and cap, replica choice, the
in-flight count, the call to the engine, one retry (SPEC §6).

`handle_completion` and `list_models` return a `Reply`; `router.asgi` (the web process's
`/v1/`) and `router.views` (Django's URLconf, for WSGI and the test client) only move bytes.

Per request, in the common case, no database query and two Redis round trips:

- the key is checked against a cache of at most `KEY_CACHE_SECONDS`;
- the model's `max_output` and its `ready` replicas come from a per-process cache of at most
  `ROUTE_CACHE_SECONDS`, stamped with the Redis key `llmgw:routes:version` read before the
  database was;
- one Lua script (one round trip, atomic across router processes) checks that version is
  still current and, if so, picks the replica with the fewest requests in flight and counts
  this one on it (`INCR llmgw:inflight:<id>`); if not, the route is read again and the pick
  repeated;
- the count is lowered (`DECR`) once the answer has been sent, failed, or its client left.

Every save of a replica, model or key bumps the version after its commit (router/apps.py).
So when the fleet marks a replica `draining` and then waits for its count to reach 0: either
our pick ran before the bump, and its INCR is already there for the drain to see, or it ran
after, saw the new version, and read the replica's new state. No request reaches a replica
after its drain saw nothing in flight. A save that skips signals (`QuerySet.update`) is seen
within `ROUTE_CACHE_SECONDS`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import AsyncIterator

import httpx
import redis.asyncio as aioredis
from django.conf import settings
from django.db import Error as DatabaseError
from django.db import connection

from . import requests as rq
from .models import hash_key

log = logging.getLogger("llmgw.router")

INFLIGHT_KEY = "llmgw:inflight:{}"  # the fleet's drain waits on this: keep the name
ROUTES_VERSION_KEY = "llmgw:routes:version"
KEY_CACHE_SECONDS = 1.0
ROUTE_CACHE_SECONDS = 1.0
RETRY_AFTER_SECONDS = 2
UPSTREAM_TIMEOUT = httpx.Timeout(
    connect=float(os.environ.get("LLMGW_ROUTER_CONNECT_TIMEOUT", 5)),
    read=float(os.environ.get("LLMGW_ROUTER_READ_TIMEOUT", 600)),
    write=30.0,
    pool=30.0,
)
UPSTREAM_LIMITS = httpx.Limits(max_connections=512, max_keepalive_connections=128, keepalive_expiry=30)

# KEYS[1] is the routes' version, KEYS[2..] the candidates' in-flight counts. When the version
# is still ARGV[1]: count one more on the candidate with the fewest in flight (the first of
# equals) and return its 0-based position; else count nothing and return -1.
PICK_AND_COUNT = """
if (redis.call('GET', KEYS[1]) or '0') ~= ARGV[1] then return -1 end
local best, fewest = 2, nil
for i = 2, #KEYS do
  local n = tonumber(redis.call('GET', KEYS[i]) or '0')
  if fewest == nil or n < fewest then best, fewest = i, n end
end
redis.call('INCR', KEYS[best])
return best - 2
"""

HOP_BY_HOP = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
    b"transfer-encoding", b"upgrade", b"content-length", b"date", b"server",
}


# --- Replies and errors -------------------------------------------------------------------------


class RouterError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type: str, code: str | None, param: str | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.headers = headers or []

    def reply(self) -> "Reply":
        body = rq.encode({"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}})
        return Reply(self.status, [(b"content-type", b"application/json")] + self.headers, body)


def error_reply(status: int, message: str, type: str, code: str | None, param: str | None = None, headers=None) -> "Reply":
    return RouterError(status, message, type, code, param, headers).reply()


def bad_request(e: rq.BadRequest) -> "Reply":
    return error_reply(400, e.message, "invalid_request_error", e.code, e.param)


def too_large(limit: int) -> "Reply":
    return error_reply(413, f"The request body is larger than {limit} bytes.", "invalid_request_error", "request_too_large")


@dataclass
class Reply:
    """What to send back: a status, headers, and either a whole body or chunks as they come."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    chunks: AsyncIterator[bytes] | None = None
    _closers: list = field(default_factory=list)

    async def aclose(self) -> None:
        """Release what the reply holds (the engine's response, the in-flight count). Idempotent;
        the server calls it when it is done, also when the client went away mid-stream."""
        closers, self._closers = self._closers, []
        if closers:
            await asyncio.shield(_close_all(closers))  # runs to the end even if we are cancelled


async def _close_all(closers) -> None:
    for close in closers:
        try:
            await close()
        except Exception:  # never let cleanup break the server
            log.exception("router: cleanup failed")


# --- The catalog, read in a few threads of our own ------------------------------------------------


@dataclass(frozen=True)
class KeyInfo:
    id: int
    name: str
    models: frozenset[str] | None  # None: every model

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models


@dataclass(frozen=True)
class Route:
    model_id: int
    max_output: int
    replicas: tuple[tuple[int, str], ...]  # (replica id, endpoint) of the ready ones


_db = ThreadPoolExecutor(max_workers=4, thread_name_prefix="llmgw-router-db")


def _with_db_retry(fn, *args):
    """Run an ORM read; a connection that went bad (database restarted) is reopened once.
    Afterwards the connection is kept or closed as DATABASE_CONN_MAX_AGE says, as Django
    does at the end of a request (these reads are rare: the routes are cached)."""
    try:
        try:
            return fn(*args)
        except DatabaseError:
            connection.close()
            return fn(*args)
    finally:
        connection.close_if_unusable_or_obsolete()


def _read_key(digest: str) -> KeyInfo | None:
    from .models import ApiKey

    row = ApiKey.objects.filter(key_hash=digest, active=True).values_list("id", "name").first()
    if row is None:
        return None
    names = frozenset(ApiKey.models.through.objects.filter(apikey_id=row[0]).values_list("model__name", flat=True))
    return KeyInfo(row[0], row[1], names or None)


def _read_route(name: str) -> Route | None:
    from catalog.choices import ReplicaState
    from catalog.models import Model, Replica

    row = Model.objects.filter(name=name).values_list("id", "max_output").first()
    if row is None:
        return None
    replicas = tuple(
        Replica.objects.filter(profile__model_id=row[0], state=ReplicaState.READY)
        .exclude(endpoint="")
        .order_by("id")
        .values_list("id", "endpoint")
    )
    return Route(row[0], row[1], replicas)


def _read_models(allowed: frozenset[str] | None) -> list[dict]:
    from catalog.models import Model

    rows = Model.objects.order_by("name").values_list("name", "created_at", "context_length", "max_output")
    if allowed is not None:
        rows = rows.filter(name__in=allowed)
    return [
        {"id": name, "object": "model", "created": int(created.timestamp()), "owned_by": "llmgw",
         "context_length": context_length, "max_output": max_output}
        for name, created, context_length, max_output in rows
    ]


async def _db_read(fn, *args):
    try:
        return await asyncio.get_running_loop().run_in_executor(_db, _with_db_retry, fn, *args)
    except DatabaseError:
        log.exception("router: the catalog could not be read")
        raise RouterError(503, "The gateway's catalog is unavailable; try again shortly.", "server_error",
                          "catalog_unavailable", headers=[(b"retry-after", str(RETRY_AFTER_SECONDS).encode())])


_keys: dict[str, tuple[float, KeyInfo | None]] = {}
_routes: dict[str, tuple[float, str, Route | None]] = {}  # model name -> (expires, version, route)


async def authenticate(authorization: str | None) -> KeyInfo:
    if not authorization:
        raise RouterError(401, "You didn't provide an API key. Send it as `Authorization: Bearer <key>`.",
                          "invalid_request_error", "missing_api_key")
    scheme, _, key = authorization.strip().partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise RouterError(401, "The Authorization header must be `Bearer <key>`.", "invalid_request_error", "invalid_api_key")
    digest = hash_key(key)
    now = time.monotonic()
    hit = _keys.get(digest)
    if hit is not None and hit[0] > now:
        info = hit[1]
    else:
        info = await _db_read(_read_key, digest)
        if len(_keys) > 10_000:  # many wrong keys: start again rather than grow
            _keys.clear()
        _keys[digest] = (now + KEY_CACHE_SECONDS, info)
    if info is None:
        raise RouterError(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
    return info


def _no_such_model(name: str) -> RouterError:
    return RouterError(404, f"The model `{name}` does not exist or you do not have access to it.",
                       "invalid_request_error", "model_not_found", "model")


# --- Per event loop: the engine client and the Redis client ----------------------------------------


class _LoopClients:
    def __init__(self):
        self.http = httpx.AsyncClient(timeout=UPSTREAM_TIMEOUT, limits=UPSTREAM_LIMITS, follow_redirects=False, trust_env=False)
        self.redis_url = None
        self.redis = None
        self.pick = None

    def counter(self):
        url = getattr(settings, "LLMGW_ROUTER_REDIS_URL", None) or settings.REDIS_URL
        if url != self.redis_url:
            self.redis = aioredis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5, health_check_interval=30)
            self.redis_url = url
            self.pick = self.redis.register_script(PICK_AND_COUNT)
        return self.redis

    async def aclose(self):
        await self.http.aclose()
        if self.redis is not None:
            await self.redis.aclose()


_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClients]" = weakref.WeakKeyDictionary()


def clients() -> _LoopClients:
    loop = asyncio.get_running_loop()
    found = _clients.get(loop)
    if found is None:
        found = _clients[loop] = _LoopClients()
    return found


async def shutdown() -> None:
    """Close this loop's clients (the ASGI lifespan's shutdown)."""
    found = _clients.pop(asyncio.get_running_loop(), None)
    if found is not None:
        await found.aclose()


class _Stale(Exception):
    """The routes changed since they were read: read them again."""


async def _version(c: _LoopClients) -> str:
    try:
        value = await c.counter().get(ROUTES_VERSION_KEY)
    except aioredis.RedisError:
        raise _counter_unavailable() from None
    return value.decode() if value is not None else "0"


def _counter_unavailable() -> RouterError:
    log.exception("router: Redis is unavailable, refusing rather than routing uncounted")
    return RouterError(503, "The gateway cannot count requests in flight right now; try again shortly.",
                       "server_error", "counter_unavailable", headers=[(b"retry-after", str(RETRY_AFTER_SECONDS).encode())])


async def _load_route(c: _LoopClients, name: str) -> tuple[Route | None, str]:
    version = await _version(c)  # before the database: a bump in between only costs a re-read
    route = await _db_read(_read_route, name)
    if len(_routes) > 10_000:
        _routes.clear()
    _routes[name] = (time.monotonic() + ROUTE_CACHE_SECONDS, version, route)
    return route, version


async def _route(c: _LoopClients, name: str) -> tuple[Route | None, str]:
    hit = _routes.get(name)
    if hit is not None and hit[0] > time.monotonic():
        return hit[2], hit[1]
    return await _load_route(c, name)


async def _take(c: _LoopClients, candidates: list[tuple[int, str]], version: str) -> tuple[int, str]:
    """Choose the candidate with the fewest requests in flight and count this one on it;
    _Stale when the routes changed since `version`."""
    c.counter()
    if len(candidates) > 1:
        candidates = random.sample(candidates, len(candidates))  # equals spread, not always the first
    try:
        index = int(await c.pick(keys=[ROUTES_VERSION_KEY] + [INFLIGHT_KEY.format(rid) for rid, _ in candidates],
                                 args=[version]))
    except aioredis.RedisError:
        raise _counter_unavailable() from None
    if index < 0:
        raise _Stale
    return candidates[index]


def _release(c: _LoopClients, replica_id: int):
    redis = c.redis

    async def release():
        try:
            await redis.decr(INFLIGHT_KEY.format(replica_id))
        except aioredis.RedisError:
            log.exception("router: could not lower the in-flight count of replica %s", replica_id)

    return release


def _engine_url(endpoint: str, path: str) -> str:
    base = endpoint.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return base + path


def _reply_headers(response: httpx.Response, replica_id: int) -> list[tuple[bytes, bytes]]:
    headers = [(k.lower(), v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP]
    headers.append((b"x-llmgw-replica", str(replica_id).encode()))
    return headers


# --- The endpoints ------------------------------------------------------------------------------------

PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


async def handle_completion(kind: str, authorization: str | None, raw: bytes) -> Reply:
    """POST /v1/chat/completions (kind "chat") or /v1/completions (kind "completion")."""
    try:
        key = await authenticate(authorization)
        try:
            body = rq.parse_body(raw)
            rq.check(body, kind)
        except rq.BadRequest as e:
            return bad_request(e)
        name = body["model"]
        if not key.allows(name):
            raise _no_such_model(name)
        c = clients()
        route, version = await _route(c, name)
        if route is None or not route.replicas:
            if await _version(c) != version:  # a refusal is worth a fresh look
                route, version = await _load_route(c, name)
            if route is None:
                raise _no_such_model(name)
        return await _forward(c, name, PATHS[kind], _Payload(body, raw), bool(body.get("stream")), route, version)
    except RouterError as e:
        return e.reply()


def _no_replica(name: str) -> RouterError:
    return RouterError(503, f"No replica of `{name}` is ready; try again shortly.", "server_error",
                       "no_ready_replica", headers=[(b"retry-after", str(RETRY_AFTER_SECONDS).encode())])


class _Payload:
    """The body for the engine, capped by the route's max_output (computed once per cap)."""

    def __init__(self, body: dict, raw: bytes):
        self.body, self.raw, self._for = body, raw, {}

    def capped(self, max_output: int) -> bytes:
        found = self._for.get(max_output)
        if found is None:
            body = dict(self.body)
            found = self._for[max_output] = rq.encode(body) if rq.clamp(body, max_output) else self.raw
        return found


async def _take_fresh(c, name: str, route: Route, version: str, failed: set[int]) -> tuple[tuple[int, str], Route, str]:
    """Pick among the route's replicas that have not failed this request, re-reading the route
    as long as it changed under us (a few times at most). Returns the pick and the route."""
    for _ in range(5):
        candidates = [r for r in route.replicas if r[0] not in failed]
        if not candidates:
            raise _no_replica(name) if not failed else _NoOther
        try:
            return await _take(c, candidates, version), route, version
        except _Stale:
            route, version = await _load_route(c, name)
            if route is None:
                raise _no_such_model(name)
    raise _no_replica(name)


class _NoOther(Exception):
    """No ready replica left to retry on."""


async def _forward(c: _LoopClients, name: str, path: str, payload: _Payload, stream: bool, route: Route, version: str) -> Reply:
    failed: set[int] = set()
    last: Reply | None = None
    last_error: Exception | None = None
    for attempt in (1, 2):
        try:
            (replica_id, endpoint), route, version = await _take_fresh(c, name, route, version, failed)
        except _NoOther:
            if last_error is None:
                break
            # No other replica: a connection that broke before any answer (an engine closing an
            # idle keep-alive connection as we reused it) is tried once more on the same one.
            (replica_id, endpoint), route, version = await _take_fresh(c, name, route, version, set())
        release = _release(c, replica_id)
        response = None
        try:
            request = c.http.build_request(
                "POST", _engine_url(endpoint, path), content=payload.capped(route.max_output),
                headers={"content-type": "application/json", "accept": "text/event-stream" if stream else "application/json"},
            )
            response = await c.http.send(request, stream=True)
            streaming = stream or response.headers.get("content-type", "").startswith("text/event-stream")
            if response.status_code >= 500 or not streaming:
                # Read the whole answer before sending any of it: a failure here can still be retried.
                content = b"".join([chunk async for chunk in response.aiter_raw()])
                await response.aclose()
                reply = Reply(response.status_code, _reply_headers(response, replica_id), content)
                reply._closers = [release]
                if response.status_code >= 500 and attempt == 1:
                    log.warning("router: replica %s answered %s; retrying on another", replica_id, response.status_code)
                    await reply.aclose()
                    failed.add(replica_id)
                    last = Reply(reply.status, reply.headers, reply.body)
                    continue
                return reply
            reply = Reply(response.status_code, _reply_headers(response, replica_id))
            reply.chunks = _relay(response, replica_id)
            reply._closers = [response.aclose, release]
            return reply
        except httpx.TransportError as e:
            if response is not None:
                await response.aclose()
            await release()
            failed.add(replica_id)
            last_error = e
            log.warning("router: replica %s failed (%s: %s)", replica_id, type(e).__name__, e)
        except BaseException:
            if response is not None:
                await asyncio.shield(response.aclose())
            await asyncio.shield(release())
            raise
    if last is not None and last_error is None:
        return last  # the engine's own 5xx, passed on when no other replica could answer
    raise RouterError(502, f"The model's replica did not answer ({type(last_error).__name__}); try again.",
                      "server_error", "upstream_unavailable", headers=[(b"retry-after", str(RETRY_AFTER_SECONDS).encode())])


async def _relay(response: httpx.Response, replica_id: int) -> AsyncIterator[bytes]:
    """The engine's bytes as they arrive. A failure mid-stream cannot be retried (the client has
    part of the answer): the stream ends, and the log says why."""
    try:
        async for chunk in response.aiter_raw():
            if chunk:
                yield chunk
    except httpx.TransportError as e:
        log.warning("router: replica %s broke off a stream (%s: %s)", replica_id, type(e).__name__, e)


async def list_models(authorization: str | None) -> Reply:
    """GET /v1/models: every model this key may use, with the context and longest answer served."""
    try:
        key = await authenticate(authorization)
        data = await _db_read(_read_models, key.models)
    except RouterError as e:
        return e.reply()
    return Reply(200, [(b"content-type", b"application/json")], rq.encode({"object": "list", "data": data}))
