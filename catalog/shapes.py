"""A model's shape, read once and cached on its row: the only code that does that I/O.

`shape_of(model)` ports the Go seed's `shapeOf` (seed/000: a GGUF header from the mirror,
else the original weights' config from their repository) and says once, in words, what could
not be checked. The shape is cached in `Model.shape` with `shape_key` = what it was read from
(source, origin repo and revision, file sizes); when that changes it is read again.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from catalog import plan_inputs
from catalog.domain import gguf
from catalog.domain.hf import HFError, fetch_hf, shape_from_hf_config
from catalog.domain.kv import ShapeError, shape_from_gguf
from catalog.domain.shape import Shape

__all__ = ["shape_of", "refresh_shape", "resolve_source", "is_gguf_source", "SourceError"]

NOT_CHECKED = "so the memory it needs is not checked"


class SourceError(ValueError):
    """A GGUF source that may not be read (outside the mirror root)."""


def is_gguf_source(source: str) -> bool:
    return bool(source) and source.lower().split("?", 1)[0].endswith(".gguf")


def _is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def resolve_source(source: str) -> str:
    """A GGUF source as read_header takes it: a URL as is; a local path resolved under
    settings.LLMGW_MIRROR_ROOT (relative paths are relative to it); nothing outside it."""
    if _is_url(source):
        return source
    root = Path(settings.LLMGW_MIRROR_ROOT).resolve()
    p = Path(source)
    p = (p if p.is_absolute() else root / p).resolve()
    if p != root and root not in p.parents:
        raise SourceError(f"{source} is outside the mirror root {root}")
    return str(p)


def _local_stamp(path: str) -> str:
    """Size and mtime of a local GGUF (all shards), cheap enough to key the cache on."""
    names = gguf.split_shard_names(path) or [path]
    parts = []
    for n in names:
        try:
            st = os.stat(n)
            parts.append(f"{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append("missing")
    return ",".join(parts)


def _origin_sizes(model) -> list[tuple[str, int]]:
    if model.pk is None:  # an unsaved model has no files yet
        return []
    return [(f.path, f.size) for f in model.files.all()]


def _key(model) -> str:
    """What the shape is read from; a different key means read again."""
    source = (model.source or "").strip()
    key: dict = {"source": source, "repo": model.origin_repo or "", "revision": model.origin_revision or ""}
    files = _origin_sizes(model)
    if files:
        key["files"] = sum(size for _, size in files)
        key["n"] = len(files)
    if is_gguf_source(source) and not _is_url(source):
        try:
            key["stat"] = _local_stamp(resolve_source(source))
        except SourceError:
            key["stat"] = "outside"
    return json.dumps(key, sort_keys=True)[:2000]


def _read(model) -> tuple[Shape | None, str, str]:
    """(shape, note, error): the I/O. error is what is stored in shape_error (empty on success)."""
    source = (model.source or "").strip()
    origin_weights = sum(size for _, size in _origin_sizes(model))
    timeout = float(getattr(settings, "LLMGW_SHAPE_TIMEOUT", 10.0))
    if is_gguf_source(source):
        try:
            path = resolve_source(source)
            header = gguf.read_header(path, timeout=timeout)
            shape = shape_from_gguf(header.metadata, header.file_size)
        except (SourceError, gguf.GGUFError, ShapeError, OSError) as exc:
            err = str(exc) or type(exc).__name__
            return None, f"its header could not be read ({err}), {NOT_CHECKED}", f"header: {err}"
        except Exception as exc:  # a reader bug must not take the console down: say what happened
            err = f"{type(exc).__name__}: {exc}"
            return None, f"its header could not be read ({err}), {NOT_CHECKED}", f"header: {err}"
        extra = dict(shape.extra)
        extra.update({"bytes_read": header.bytes_read, "requests": header.requests})
        shape = Shape.from_dict({**shape.to_dict(), "extra": extra})
    elif model.origin_repo:
        try:
            config, hub_weights = fetch_hf(model.origin_repo, model.origin_revision or None, timeout=timeout)
            shape = shape_from_hf_config(config, origin_weights or hub_weights)
        except HFError as exc:
            return None, f"its config could not be read ({exc}), {NOT_CHECKED}", f"config: {exc}"
        except Exception as exc:  # an odd config the rules did not foresee
            err = f"{type(exc).__name__}: {exc}"
            return None, f"its config could not be read ({err}), {NOT_CHECKED}", f"config: {err}"
    else:
        note = f"where it came from is not known, {NOT_CHECKED}"
        return None, note, "origin: unknown"
    if not shape.weights_bytes:
        return shape, f"its files' sizes are not known, {NOT_CHECKED}", ""
    return shape, "", ""


def _note_for(shape: Shape | None, error: str) -> str:
    """The note for a cached result (the same words _read gave)."""
    if error.startswith("header: "):
        return f"its header could not be read ({error[8:]}), {NOT_CHECKED}"
    if error.startswith("config: "):
        return f"its config could not be read ({error[8:]}), {NOT_CHECKED}"
    if error.startswith("origin: "):
        return f"where it came from is not known, {NOT_CHECKED}"
    if error.startswith("error: "):
        return f"its shape could not be read ({error[7:]}), {NOT_CHECKED}"
    if shape is not None and not shape.weights_bytes:
        return f"its files' sizes are not known, {NOT_CHECKED}"
    return ""


def _store(model, shape: Shape | None, error: str, key: str) -> None:
    now = timezone.now()
    data = shape.to_dict() if shape is not None else None
    type(model).objects.filter(pk=model.pk).update(shape=data, shape_key=key, shape_error=error, shape_read_at=now)
    plan_inputs.catalog_changed()  # an update() sends no signal
    model.shape, model.shape_key, model.shape_error, model.shape_read_at = data, key, error, now


def shape_of(model, *, force: bool = False) -> tuple[Shape | None, str]:
    """The model's shape and, when its memory cannot be checked, why (the seed's words).
    Never raises for unreadable input. A failed read is retried after
    LLMGW_SHAPE_ERROR_TTL seconds (default 60) so that a live preview does not hammer a
    mirror that is down; refresh_shape() reads again at once."""
    key = _key(model)
    if not force and model.shape_key == key and model.shape_read_at is not None:
        cached = None
        if model.shape:
            try:
                cached = Shape.from_dict(model.shape)
            except (TypeError, ValueError):
                cached = None
        if cached is not None or model.shape_error:
            ttl = float(settings.LLMGW_SHAPE_ERROR_TTL)
            fresh = not model.shape_error or model.shape_read_at > timezone.now() - timedelta(seconds=ttl)
            if fresh:
                return cached, _note_for(cached, model.shape_error or "")
    try:
        shape, note, error = _read(model)
    except Exception as exc:  # a reader bug must not take the console down: say so instead
        err = f"{type(exc).__name__}: {exc}"
        shape, note, error = None, f"its shape could not be read ({err}), {NOT_CHECKED}", f"error: {err}"
    if model.pk is not None:
        _store(model, shape, error, key)
    return shape, note


def refresh_shape(model) -> tuple[Shape | None, str]:
    """Read the shape again, whatever is cached."""
    return shape_of(model, force=True)
