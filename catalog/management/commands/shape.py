"""python manage.py shape SOURCE | --hf-config FILE | --hf-repo REPO [--engine E] [--context N]
[--slots S] [--cache-type T] [--json]: a model's shape and the KV bytes one engine allocates."""

from __future__ import annotations

import json
import os

from django.core.management.base import BaseCommand, CommandError

from catalog.domain import gguf
from catalog.domain.hf import HFError, fetch_hf, shape_from_hf_config
from catalog.domain.kv import ENGINES, KVError, ShapeError, kv_bytes, shape_from_gguf
from catalog.shapes import SourceError, resolve_source

GIB = 1 << 30
MIB = 1 << 20


def _size(n: int) -> str:
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    return f"{n / MIB:.2f} MiB"


class Command(BaseCommand):
    help = "Show a model's shape (GGUF path or URL, or a Hugging Face config) and its KV bytes for an engine."

    def add_arguments(self, parser):
        parser.add_argument("source", nargs="?", help="a GGUF file, a path under the mirror root, or an http(s) URL")
        parser.add_argument("--hf-config", metavar="FILE", help="a config.json file")
        parser.add_argument("--hf-repo", metavar="REPO", help="a Hugging Face repository (HF_ENDPOINT honoured)")
        parser.add_argument("--revision", help="the repository's revision")
        parser.add_argument("--engine", default="llamacpp", choices=ENGINES)
        parser.add_argument("--context", type=int, help="tokens one request may use (default: the trained context)")
        parser.add_argument("--slots", type=int, default=1, help="requests at once (default 1)")
        parser.add_argument("--cache-type", help="KV cache type, K and V alike (llama.cpp: f16, q8_0, ...; vLLM/SGLang: auto, fp8)")
        parser.add_argument("--timeout", type=float, default=10.0, help="seconds per network read")
        parser.add_argument("--json", action="store_true", help="one JSON object")

    def handle(self, *args, **opts):
        given = [x for x in (opts["source"], opts["hf_config"], opts["hf_repo"]) if x]
        if len(given) != 1:
            raise CommandError("give exactly one of SOURCE, --hf-config FILE or --hf-repo REPO")
        if opts["slots"] is None or opts["slots"] < 1:
            raise CommandError("--slots must be at least 1")
        if opts["context"] is not None and opts["context"] < 1:
            raise CommandError("--context must be a positive number of tokens")
        extra: dict = {}
        if opts["source"]:
            try:
                # an admin's own file (as given, from the shell) or a source as the catalog has it
                # (relative to the mirror root, never outside it)
                given_path = opts["source"]
                if not given_path.startswith(("http://", "https://")) and os.path.isfile(given_path):
                    path = os.path.abspath(given_path)
                else:
                    path = resolve_source(given_path)
                header = gguf.read_header(path, timeout=opts["timeout"])
                shape = shape_from_gguf(header.metadata, header.file_size)
            except (SourceError, gguf.GGUFError, ShapeError, OSError) as exc:
                raise CommandError(f"{opts['source']}: {exc}") from None
            if path.startswith(("http://", "https://")):
                extra = {"bytes_read": header.bytes_read, "requests": header.requests}
            what = opts["source"]
        elif opts["hf_config"]:
            try:
                with open(opts["hf_config"], encoding="utf-8") as f:
                    config = json.load(f)
                shape = shape_from_hf_config(config)
            except (OSError, ValueError) as exc:  # JSONDecodeError and HFError are ValueErrors
                raise CommandError(f"{opts['hf_config']}: {exc}") from None
            what = opts["hf_config"]
        else:
            try:
                config, weights = fetch_hf(opts["hf_repo"], opts["revision"], timeout=opts["timeout"])
                shape = shape_from_hf_config(config, weights)
            except HFError as exc:
                raise CommandError(str(exc)) from None
            what = opts["hf_repo"] + (f"@{opts['revision']}" if opts["revision"] else "")

        engine = opts["engine"]
        context = opts["context"] or shape.trained_context
        if not context:
            raise CommandError("the model does not say its trained context: pass --context")
        settings_kw: dict = {}
        if opts["cache_type"]:
            ct = opts["cache_type"].lower()
            settings_kw = {"cache_type_k": ct, "cache_type_v": ct}
        elif engine in ("vllm", "sglang"):
            settings_kw = {"cache_type_k": "auto"}
        try:
            kv = kv_bytes(shape, engine, context, opts["slots"], **settings_kw)
        except KVError as exc:
            raise CommandError(str(exc)) from None

        out = {
            "source": what,
            "architecture": shape.architecture,
            "layers": shape.layers,
            "heads": shape.heads,
            "kv_heads": shape.kv_heads,
            "head_k": shape.head_k,
            "head_v": shape.head_v,
            "trained_context": shape.trained_context,
            "rope_scaling": shape.rope_scaling,
            "sliding_window": shape.sliding_window,
            "swa_layers": sum(1 for i in range(shape.layers) if shape.is_swa(i)),
            "recurrent_layers": sum(1 for i in range(shape.layers) if shape.is_recurrent(i)),
            "mla": shape.mla,
            "kv_per_token": shape.kv_per_token,
            "engine": engine,
            "context": context,
            "slots": opts["slots"],
            "cache_type": opts["cache_type"] or ("f16" if engine == "llamacpp" else "auto"),
            "kv_bytes": kv.total,
            "kv_cache_bytes": kv.kv,
            "state_bytes": kv.state,
            "weights_bytes": shape.weights_bytes,
            **extra,
        }
        if opts["json"]:
            self.stdout.write(json.dumps(out))
            return
        rows = [
            ("model", f"{what} ({shape.architecture}, {shape.source_kind})"),
            ("layers", f"{shape.layers} ({out['swa_layers']} sliding-window, {out['recurrent_layers']} recurrent)"),
            ("heads / KV heads", f"{shape.heads} / {shape.kv_heads}" + (" (MLA latent)" if shape.mla else "")),
            ("K / V width", f"{shape.head_k} / {shape.head_v}"),
            ("trained context", f"{shape.trained_context}" + (f" ({shape.rope_scaling})" if shape.rope_scaling else "")),
        ]
        if shape.sliding_window:
            rows.append(("sliding window", f"{shape.sliding_window} tokens"))
        rows += [
            ("KV per token", f"{shape.kv_per_token} B (full-attention layers, f16)"),
            (f"{engine} KV", f"{_size(kv.kv)} for {context} tokens x {opts['slots']} slot(s), {out['cache_type']}"),
            ("recurrent state", _size(kv.state)),
            ("total", _size(kv.total)),
            ("weights", _size(shape.weights_bytes) if shape.weights_bytes else "unknown"),
        ]
        if extra:
            rows.append(("header read", f"{extra['bytes_read']} bytes in {extra['requests']} request(s)"))
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            self.stdout.write(f"{k.ljust(width)}  {v}")
