"""A stand-in engine process for the engines that need GPUs this machine has not got.

    python -m catalog.fleet.standin ENGINE [the engine's own flags] --trained-context N

ENGINE is vllm, sglang, strata or freetoken. It parses the engine's real command-line
flags (the main ones), refuses an unknown flag the way the engine's parser does (exit 2),
refuses a context longer than the model was trained for with the engine's own message
(exit 1), and then speaks the engine's HTTP: `/health`, `/v1/models` (with
max_model_len), `/v1/completions` and `/v1/chat/completions` (OpenAI shapes, streaming
too). Each generated token takes `LLMGW_STANDIN_TOKEN_DELAY` seconds (default 0.01), so
in-flight requests last long enough to be seen. Standard library only."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = "the quick brown fox jumps over a lazy dog while seven tiny models serve answers".split()


class _Parser(argparse.ArgumentParser):
    """argparse, with the engine's program name in its errors (exit code 2, as argparse)."""


def _bool_flag(p, *names):
    p.add_argument(*names, action="store_true")


def vllm_parser() -> argparse.ArgumentParser:
    # vllm/entrypoints/openai/cli_args.py + vllm/engine/arg_utils.py (EngineArgs.add_cli_args)
    p = _Parser(prog="vllm serve", usage="vllm serve [model_tag] [options]")
    p.add_argument("model_tag", nargs="?")
    p.add_argument("--model")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--max-model-len", type=str)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--quantization", "-q")
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--block-size", type=int)
    p.add_argument("--swap-space", type=float)
    p.add_argument("--cpu-offload-gb", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--tokenizer")
    p.add_argument("--revision")
    p.add_argument("--download-dir")
    p.add_argument("--api-key")
    p.add_argument("--generation-config")
    p.add_argument("--hf-overrides")
    p.add_argument("--rope-scaling")
    p.add_argument("--chat-template")
    p.add_argument("--tool-call-parser")
    p.add_argument("--reasoning-parser")
    p.add_argument("--uvicorn-log-level")
    p.add_argument("--max-logprobs", type=int)
    p.add_argument("--limit-mm-per-prompt")
    for flag in ("--trust-remote-code", "--enforce-eager", "--enable-prefix-caching", "--no-enable-prefix-caching",
                 "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--disable-log-requests",
                 "--disable-log-stats", "--enable-auto-tool-choice", "--enable-expert-parallel",
                 "--disable-custom-all-reduce"):
        _bool_flag(p, flag)
    p.add_argument("--trained-context", type=int, default=0, help=argparse.SUPPRESS)
    return p


def sglang_parser() -> argparse.ArgumentParser:
    # sglang/srt/server_args.py (ServerArgs.add_cli_args)
    p = _Parser(prog="launch_server.py")
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--tokenizer-path")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--served-model-name")
    p.add_argument("--context-length", type=int)
    p.add_argument("--tensor-parallel-size", "--tp-size", "--tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "--pp-size", type=int, default=1)
    p.add_argument("--data-parallel-size", "--dp-size", "--dp", type=int, default=1)
    p.add_argument("--expert-parallel-size", "--ep-size", "--ep", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--max-total-tokens", type=int)
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--max-prefill-tokens", type=int)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--quantization")
    p.add_argument("--attention-backend")
    p.add_argument("--random-seed", type=int)
    p.add_argument("--log-level", default="info")
    p.add_argument("--api-key")
    p.add_argument("--chat-template")
    p.add_argument("--json-model-override-args")
    p.add_argument("--revision")
    p.add_argument("--reasoning-parser")
    p.add_argument("--tool-call-parser")
    for flag in ("--trust-remote-code", "--disable-cuda-graph", "--disable-radix-cache", "--enable-torch-compile",
                 "--enable-mixed-chunk", "--enable-dp-attention", "--skip-server-warmup", "--enable-metrics"):
        _bool_flag(p, flag)
    p.add_argument("--trained-context", type=int, default=0, help=argparse.SUPPRESS)
    return p


def strata_parser() -> argparse.ArgumentParser:
    # strata's server: experts stay in host memory; its setup writes the start script.
    p = _Parser(prog="strata serve")
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--context", type=int)
    p.add_argument("--gpu-layers", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--kv-cache-type")
    p.add_argument("--experts-on", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--trained-context", type=int, default=0, help=argparse.SUPPRESS)
    return p


def freetoken_parser() -> argparse.ArgumentParser:
    # freetoken's server: MoE experts in RAM, attention on the card.
    p = _Parser(prog="freetoken serve")
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-seq-len-override", type=int)
    p.add_argument("--max-batch-size", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--expert-cache-gb", type=float)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--trained-context", type=int, default=0, help=argparse.SUPPRESS)
    return p


PARSERS = {"vllm": vllm_parser, "sglang": sglang_parser, "strata": strata_parser, "freetoken": freetoken_parser}


class Refused(Exception):
    """The engine refuses to start: message as the engine prints it, and its exit code."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def _vllm_len(text: str | None) -> int | None:
    if text is None:
        return None
    t = text.strip().lower()
    mult = 1
    if t and t[-1] in "km":
        mult = 1000 if t[-1] == "k" else 1000_000
        t = t[:-1]
    try:
        return int(float(t) * mult)
    except ValueError:
        raise Refused(f"vllm serve: error: argument --max-model-len: invalid human_readable_int value: '{text}'", 2)


def configure(engine: str, argv: list[str]) -> dict:
    """Parse the engine's flags; return what the server needs, or raise Refused / SystemExit(2)."""
    if engine not in PARSERS:
        raise Refused(f"standin: unknown engine {engine!r} (one of {', '.join(PARSERS)})", 2)
    ns = PARSERS[engine]().parse_args(argv)  # unknown flag: the engine's usage + error, exit 2
    trained = ns.trained_context or 0
    if engine == "vllm":
        model = ns.model_tag or ns.model
        if not model:
            raise Refused("vllm serve: error: the following arguments are required: model_tag", 2)
        asked = _vllm_len(ns.max_model_len)
        if asked is not None and trained and asked > trained:
            raise Refused(
                f"ValueError: User-specified max_model_len ({asked}) is greater than the derived max_model_len "
                f"(max_position_embeddings={trained} or model_max_length=None in model's config.json). This may "
                "lead to incorrect model outputs or CUDA errors. To allow overriding this maximum, set the env var "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
            )
        name = (ns.served_model_name or [model])[0]
        return {"engine": engine, "model": model, "name": name, "host": ns.host, "port": ns.port,
                "max_model_len": asked or trained or 4096}
    if engine == "sglang":
        asked = ns.context_length
        if asked is not None and trained and asked > trained:
            raise Refused(
                f"ValueError: User-specified context_length ({asked}) is greater than the derived context_length "
                f"({trained}). This may lead to incorrect model outputs or CUDA errors. Note that the derived "
                "context_length may differ from max_position_embeddings in the model's config. To allow overriding "
                "this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
            )
        return {"engine": engine, "model": ns.model_path, "name": ns.served_model_name or ns.model_path,
                "host": ns.host, "port": ns.port, "max_model_len": asked or trained or 4096}
    if engine == "strata":
        asked = ns.context
        if asked is not None and trained and asked > trained:
            raise Refused(f"strata: error: --context {asked} exceeds the model's trained context ({trained} tokens)")
        return {"engine": engine, "model": ns.model, "name": ns.model, "host": ns.host, "port": ns.port,
                "max_model_len": asked or trained or 4096}
    asked = ns.max_seq_len_override
    if asked is not None and trained and asked > trained:
        raise Refused(f"freetoken: error: --max-seq-len-override {asked} is larger than the model's "
                      f"max_position_embeddings ({trained})")
    return {"engine": engine, "model": ns.model, "name": ns.model, "host": ns.host, "port": ns.port,
            "max_model_len": asked or trained or 4096}


def _count_tokens(text: str) -> int:
    return max(1, len(text.split()))


class Handler(BaseHTTPRequestHandler):
    server_version = "standin"
    protocol_version = "HTTP/1.1"
    cfg: dict = {}
    delay: float = 0.01

    def log_message(self, fmt, *args):  # one line per request, on stderr (the replica's log)
        sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))

    def _json(self, status: int, body: dict | None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        self._json(status, {"object": "error", "message": message, "type": kind, "param": None, "code": status})

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate"):
            return self._json(200, None)
        if path == "/v1/models":
            c = self.cfg
            return self._json(200, {"object": "list", "data": [{
                "id": c["name"], "object": "model", "created": int(time.time()), "owned_by": c["engine"],
                "root": c["model"], "parent": None, "max_model_len": c["max_model_len"]}]})
        if path == "/get_model_info" and self.cfg["engine"] == "sglang":
            return self._json(200, {"model_path": self.cfg["model"], "is_generation": True,
                                    "context_length": self.cfg["max_model_len"]})
        self._error(404, "Not Found", "NotFoundError")

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        if path not in ("/v1/completions", "/v1/chat/completions"):
            return self._error(404, "Not Found", "NotFoundError")
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
        except (ValueError, UnicodeDecodeError) as e:
            return self._error(400, f"invalid JSON body: {e}")
        chat = path.endswith("chat/completions")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return self._error(400, "messages: field required")
            prompt = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list):
                prompt = " ".join(map(str, prompt))
            if not isinstance(prompt, str):
                return self._error(400, "prompt: field required")
        cap = body.get("max_completion_tokens") if chat and body.get("max_completion_tokens") is not None else body.get("max_tokens")
        prompt_tokens = _count_tokens(prompt)
        limit = self.cfg["max_model_len"]
        if cap is None:
            cap = 16 if not chat else max(0, limit - prompt_tokens)
        if not isinstance(cap, int) or cap < 0:
            return self._error(400, "max_tokens must be a non-negative integer")
        if prompt_tokens + cap > limit:
            return self._error(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                    f"{prompt_tokens + cap} tokens ({prompt_tokens} in the messages, {cap} in the "
                                    "completion). Please reduce the length of the messages or completion.")
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        model = body.get("model") or self.cfg["name"]
        words = [WORDS[i % len(WORDS)] for i in range(cap)]
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": cap, "total_tokens": prompt_tokens + cap}
        finish = "length"
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

            def send(obj):
                self.wfile.write(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")
                self.wfile.flush()

            try:
                if chat:
                    send({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                          "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
                for i, w in enumerate(words):
                    time.sleep(self.delay)
                    piece = (" " if i else "") + w
                    if chat:
                        send({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                              "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
                    else:
                        send({"id": rid, "object": "text_completion", "created": created, "model": model,
                              "choices": [{"index": 0, "text": piece, "logprobs": None, "finish_reason": None}]})
                last = {"index": 0, "finish_reason": finish}
                last.update({"delta": {}} if chat else {"text": "", "logprobs": None})
                end = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                       "model": model, "choices": [last]}
                if (body.get("stream_options") or {}).get("include_usage"):
                    end["usage"] = usage
                send(end)
                send(b"[DONE]")
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        time.sleep(self.delay * cap)
        text = " ".join(words)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish}
            return self._json(200, {"id": rid, "object": "chat.completion", "created": created, "model": model,
                                    "choices": [choice], "usage": usage})
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        self._json(200, {"id": rid, "object": "text_completion", "created": created, "model": model,
                         "choices": [choice], "usage": usage})


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m catalog.fleet.standin ENGINE [engine flags]", file=sys.stderr)
        return 2
    engine, rest = argv[0], argv[1:]
    try:
        cfg = configure(engine, rest)
    except Refused as e:
        print(str(e), file=sys.stderr, flush=True)
        return e.code
    handler = type("BoundHandler", (Handler,), {"cfg": cfg, "delay": float(os.environ.get("LLMGW_STANDIN_TOKEN_DELAY", "0.01"))})
    server = ThreadingHTTPServer((cfg["host"], cfg["port"]), handler)
    server.daemon_threads = True

    def stop(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"{engine} stand-in serving {cfg['name']} on http://{cfg['host']}:{cfg['port']} "
          f"(max_model_len={cfg['max_model_len']})", file=sys.stderr, flush=True)
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
