"""The router as a small ASGI app in front of Django: `/v1/...` is answered here, everything
else goes to Django (see llmgw_console/asgi.py, and bench/bench_router.py for why).

Here the body is read with its size bounded as it arrives (413 before more is read), a
streamed answer is passed on chunk by chunk, and a client that goes away mid-stream ends the
engine's request and releases the in-flight count at once.
"""

from __future__ import annotations

import asyncio
import logging

from django.conf import settings

from . import gateway

log = logging.getLogger("llmgw.router")

ROUTES = {
    "/v1/chat/completions": ("POST", "chat"),
    "/v1/completions": ("POST", "completion"),
    "/v1/models": ("GET", None),
}


def _header(scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return v.decode("latin-1")
    return None


async def _send_reply(send, reply: gateway.Reply) -> None:
    headers = list(reply.headers)
    if reply.chunks is None:
        headers.append((b"content-length", str(len(reply.body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    if reply.chunks is None:
        await send({"type": "http.response.body", "body": reply.body})
        return
    async for chunk in reply.chunks:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


class _TooLarge(Exception):
    pass


class _Gone(Exception):
    pass


async def _read_body(scope, receive, limit: int) -> bytes:
    declared = _header(scope, b"content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise _TooLarge
        except ValueError:
            pass
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


async def serve(scope, receive, send) -> None:
    """Answer one `/v1/...` HTTP request."""
    path = scope["path"].rstrip("/") or "/"
    route = ROUTES.get(path)
    if route is None:
        reply = gateway.error_reply(404, f"Unknown path {scope['path']}.", "invalid_request_error", "unknown_url")
        return await _send_reply(send, reply)
    method, kind = route
    if scope["method"] != method:
        reply = gateway.error_reply(405, f"{scope['path']} takes {method}.", "invalid_request_error", "method_not_allowed",
                                    headers=[(b"allow", method.encode())])
        return await _send_reply(send, reply)
    authorization = _header(scope, b"authorization")
    if kind is None:
        return await _send_reply(send, await gateway.list_models(authorization))
    limit = settings.LLMGW_ROUTER_MAX_BODY
    try:
        raw = await _read_body(scope, receive, limit)
    except _TooLarge:
        return await _send_reply(send, gateway.too_large(limit))
    except _Gone:
        return
    # From here on, watch for the client leaving: waiting on the engine or relaying its
    # stream, the request is then cancelled, which closes the engine's connection (llama-server
    # stops generating) and releases the in-flight count at once.
    task = asyncio.current_task()
    gone = False

    async def watch():
        nonlocal gone
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone = True
                task.cancel()
                return

    watcher = asyncio.create_task(watch())
    reply = None
    try:
        try:
            reply = await gateway.handle_completion(kind, authorization, raw)
            await _send_reply(send, reply)
        finally:
            # No await between the last send and this: the watcher, woken by the response's
            # end, is cancelled before it can take that for a client leaving.
            watcher.cancel()
            if reply is not None:
                await reply.aclose()  # the in-flight count drops once the answer is out
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
    except OSError:  # the server noticed the client left before we did
        pass


class RouterDispatch:
    """`/v1/...` to the router, lifespan handled here, everything else to `app` (Django)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        kind = scope["type"]
        if kind == "http" and (scope["path"] == "/v1" or scope["path"].startswith("/v1/")):
            return await serve(scope, receive, send)
        if kind == "lifespan":
            return await self._lifespan(receive, send)
        return await self.app(scope, receive, send)

    async def _lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await gateway.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return
