"""The router's endpoints as Django views: what `/v1/` resolves to in Django's URLconf (WSGI,
`runserver`, the test client). The web process answers `/v1/` before Django, in
`router.asgi`; both call `router.gateway` and only move bytes.

The views take API keys, not sessions: exempt from login and CSRF. Under WSGI a streamed
answer is sent whole (no event loop outlives the view there); under ASGI it streams.
"""

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.contrib.auth.decorators import login_not_required
from django.http import HttpResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from . import gateway


async def _respond(request, reply: gateway.Reply):
    if isinstance(request, ASGIRequest):
        if reply.chunks is None:
            await reply.aclose()
        return _response(reply)
    # Under WSGI each async view runs in an event loop of its own that ends with it: the
    # engine's answer is read here, whole, and the loop's clients are closed with it.
    try:
        if reply.chunks is not None:
            reply.body = b"".join([chunk async for chunk in reply.chunks])
            reply.chunks = None
    finally:
        await reply.aclose()
        await gateway.shutdown()
    return _response(reply)


def _response(reply: gateway.Reply):
    if reply.chunks is None:
        response = HttpResponse(reply.body, status=reply.status)
    else:
        async def relay():
            try:
                async for chunk in reply.chunks:
                    yield chunk
            finally:
                await reply.aclose()

        response = StreamingHttpResponse(relay(), status=reply.status)
    for name, value in reply.headers:
        response[name.decode("latin-1")] = value.decode("latin-1")
    return response


def _wrong_method(request, allowed: str):
    reply = gateway.error_reply(405, f"{request.path} takes {allowed}.", "invalid_request_error", "method_not_allowed",
                                headers=[(b"allow", allowed.encode())])
    return _response(reply)


async def _completion(request, kind: str):
    if request.method != "POST":
        return _wrong_method(request, "POST")
    limit = settings.LLMGW_ROUTER_MAX_BODY
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        return _response(gateway.too_large(limit))
    raw = request.read(limit + 1)  # not request.body: its own cap (DATA_UPLOAD_MAX_MEMORY_SIZE) is not ours
    if len(raw) > limit:
        return _response(gateway.too_large(limit))
    return await _respond(request, await gateway.handle_completion(kind, request.headers.get("authorization"), raw))


@csrf_exempt
@login_not_required
async def chat_completions(request):
    return await _completion(request, "chat")


@csrf_exempt
@login_not_required
async def completions(request):
    return await _completion(request, "completion")


@csrf_exempt
@login_not_required
async def models(request):
    if request.method != "GET":
        return _wrong_method(request, "GET")
    return await _respond(request, await gateway.list_models(request.headers.get("authorization")))
