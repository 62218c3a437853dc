"""What each engine kind is started with, where it says it is healthy, and how to ask it
for one real completion.

The command of an engine kind is a template (a list of strings) from
`settings.LLMGW_ENGINE_COMMANDS[engine]` when set, else the default below; the profile's
args are appended. Placeholders: {binary} (llama-server), {python}, {model} (the model's
local file or URL), {name} (the model's name, served as), {host}, {port}, {trained_context}.

Engines listed in `settings.LLMGW_STANDIN_ENGINES` run as the stand-in
(`catalog.fleet.standin`): a small process that parses the engine's real flags and speaks
its HTTP, for machines without the engine's GPUs. See docs/fleet.md."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from django.conf import settings

# The real engines' command lines.
REAL_COMMANDS: dict[str, list[str]] = {
    "llamacpp": ["{binary}", "-m", "{model}", "--host", "{host}", "--port", "{port}", "--fit", "off", "--no-warmup"],
    "vllm": ["vllm", "serve", "{model}", "--served-model-name", "{name}", "--host", "{host}", "--port", "{port}"],
    "sglang": ["{python}", "-m", "sglang.launch_server", "--model-path", "{model}", "--served-model-name", "{name}",
               "--host", "{host}", "--port", "{port}"],
    # strata: the setup writes the start script; the server takes the model and --context.
    "strata": ["strata", "serve", "--model", "{model}", "--host", "{host}", "--port", "{port}"],
    # freetoken: experts in RAM; --max-seq-len-override sets the context.
    "freetoken": ["freetoken", "serve", "--model", "{model}", "--host", "{host}", "--port", "{port}"],
}

# The stand-ins: `python -m catalog.fleet.standin ENGINE` followed by the engine's own flags,
# plus the trained context the real engine would read from the model's config.
_STANDIN = ["{python}", "-m", "catalog.fleet.standin"]
STANDIN_COMMANDS: dict[str, list[str]] = {
    "vllm": [*_STANDIN, "vllm", "{model}", "--served-model-name", "{name}", "--host", "{host}", "--port", "{port}",
             "--trained-context", "{trained_context}"],
    "sglang": [*_STANDIN, "sglang", "--model-path", "{model}", "--served-model-name", "{name}", "--host", "{host}",
               "--port", "{port}", "--trained-context", "{trained_context}"],
    "strata": [*_STANDIN, "strata", "--model", "{model}", "--host", "{host}", "--port", "{port}",
               "--trained-context", "{trained_context}"],
    "freetoken": [*_STANDIN, "freetoken", "--model", "{model}", "--host", "{host}", "--port", "{port}",
                  "--trained-context", "{trained_context}"],
}

HEALTH_PATH = {"llamacpp": "/health", "vllm": "/health", "sglang": "/health", "strata": "/health", "freetoken": "/health"}


@dataclass(frozen=True)
class Probe:
    """One real completion: where to send it and what a good answer looks like."""

    path: str
    body: dict


@lru_cache(maxsize=1)
def llama_server_binary() -> str:
    spec = importlib.util.spec_from_file_location("llmgw_llama_server", Path(settings.BASE_DIR) / "scripts" / "llama_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.llama_server_path())


def uses_standin(engine: str) -> bool:
    return engine in getattr(settings, "LLMGW_STANDIN_ENGINES", ["vllm", "sglang", "strata", "freetoken"])


def template(engine: str) -> list[str]:
    configured = (settings.LLMGW_ENGINE_COMMANDS or {}).get(engine)
    if configured:
        return list(configured)
    if uses_standin(engine) and engine in STANDIN_COMMANDS:
        return list(STANDIN_COMMANDS[engine])
    return list(REAL_COMMANDS[engine])


def model_location(model) -> str:
    """The model's weights as the engine reads them: a URL as is, a path under the mirror root."""
    source = model.source or model.name
    if "://" in source:
        return source
    path = Path(source)
    if not path.is_absolute():
        path = Path(settings.LLMGW_MIRROR_ROOT) / path
    return str(path)


def trained_context(model) -> int:
    shape = model.shape or {}
    return int(shape.get("trained_context") or 0) or int(model.context_length or 0) or 4096


def command(engine: str, model, host: str, port: int, args: list[str]) -> list[str]:
    values = {
        "python": sys.executable,
        "model": model_location(model),
        "name": model.name,
        "host": host,
        "port": str(port),
        "trained_context": str(trained_context(model)),
    }
    tpl = template(engine)
    if any("{binary}" in part for part in tpl):
        values["binary"] = llama_server_binary()
    return [part.format(**values) for part in tpl] + [str(a) for a in args]


def health_url(engine: str, endpoint: str) -> str:
    return endpoint.rstrip("/") + HEALTH_PATH.get(engine, "/health")


def probe(engine: str, model_name: str) -> Probe:
    """A completion of at most 2 tokens: proof that the engine really generates."""
    if engine == "llamacpp":
        return Probe("/completion", {"prompt": "Hello", "n_predict": 2, "cache_prompt": False})
    return Probe("/v1/completions", {"model": model_name, "prompt": "Hello", "max_tokens": 2})
