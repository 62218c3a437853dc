"""What the router does to a request body before it goes to an engine: pure functions, no I/O.

Checks the few fields the router itself relies on (`model`, `messages`/`prompt`, `stream`, the
length fields), and holds the answer's length to the model's `max_output` (SPEC §6). Every other
field goes to the engine untouched: the engine is the judge of its own parameters.
"""

from __future__ import annotations

import json

# The fields that bound the answer's length. `max_tokens` and `max_completion_tokens` are
# OpenAI's; `n_predict` is llama.cpp's own name for the same limit, which llama-server lets win
# over the other two (tools/server/server-common.cpp, "if n_predict is present, we overwrite"),
# so a client could otherwise use it to escape the cap.
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict")


class BadRequest(Exception):
    """A request the router refuses before it reaches an engine (400, OpenAI's error shape)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = "invalid_value"):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def _no_constant(name: str):
    raise BadRequest(f"The body is not valid JSON: {name} is not a JSON value.", code="invalid_json")


def parse_body(raw: bytes) -> dict:
    if not raw.strip():
        raise BadRequest("The request has no body: send a JSON object.", code="invalid_json")
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise BadRequest(f"The body is not valid JSON: {e}", code="invalid_json") from None
    except BadRequest:
        raise
    except RecursionError:
        raise BadRequest("The body is nested too deeply.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("The body must be a JSON object.", code="invalid_json")
    return body


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check(body: dict, kind: str) -> None:
    """Refuse what the router cannot route or cap. `kind` is "chat" or "completion"."""
    model = body.get("model")
    if model is None:
        raise BadRequest("You must provide a model parameter.", param="model", code="missing_required_parameter")
    if not isinstance(model, str) or not model:
        raise BadRequest("`model` must be a non-empty string.", param="model")
    if kind == "chat":
        messages = body.get("messages")
        if messages is None:
            raise BadRequest("`messages` is required.", param="messages", code="missing_required_parameter")
        if not isinstance(messages, list):
            raise BadRequest("`messages` must be a list of messages.", param="messages")
        if not messages:
            raise BadRequest("`messages` must not be empty.", param="messages")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise BadRequest(f"`messages[{i}]` must be an object.", param=f"messages[{i}]")
    else:
        prompt = body.get("prompt")
        if prompt is None:
            raise BadRequest("`prompt` is required.", param="prompt", code="missing_required_parameter")
        if not isinstance(prompt, (str, list)):
            raise BadRequest("`prompt` must be a string or a list.", param="prompt")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("`stream` must be true or false.", param="stream")
    for field in LENGTH_FIELDS:
        value = body.get(field)
        if value is None:
            continue
        if not _is_int(value):
            raise BadRequest(f"`{field}` must be a whole number, not {json.dumps(value)[:40]}.", param=field)
        lowest = -1 if field == "n_predict" else 0
        if value < lowest:
            raise BadRequest(f"`{field}` must be at least {lowest}.", param=field)


def clamp(body: dict, max_output: int) -> bool:
    """Hold the answer's length to `max_output` (0: no limit); True when the body changed.

    Each length field the client sent is lowered to the cap when larger (a smaller one is
    left alone; llama.cpp's `n_predict: -1`, "no limit", becomes the cap). When the client sent
    none, `max_tokens` is filled in: the one every engine reads.
    """
    if max_output <= 0:
        return False
    changed = False
    present = False
    for field in LENGTH_FIELDS:
        value = body.get(field)
        if value is None:
            if field in body:  # an explicit null means "no limit" to OpenAI clients
                del body[field]
                changed = True
            continue
        present = True
        if value < 0 or value > max_output:
            body[field] = max_output
            changed = True
    if not present:
        body["max_tokens"] = max_output
        changed = True
    return changed


def encode(body: dict) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
