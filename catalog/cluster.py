"""Declared models: the cluster's TOML file, which operators keep under version control.

    [[models]]
    name = "qwen2.5-7b"
    source = ""                        # a GGUF URL or mirror path, or empty for an HF origin
    context_length = 32768
    max_output = 8192
    origin = { repo = "Qwen/Qwen2.5-7B-Instruct", revision = "main",
               files = [ { path = "model-00001-of-00004.safetensors", size = 3945441440 } ] }

    [[models.profiles]]
    name = "vllm-l40s"
    engine = "vllm"
    args = ["--max-model-len", "32768"]
    gpu_class = "L40S"
    gpus_per_node = 1

Loading validates the whole file first, then writes it in one transaction: a bad file gets
an error naming the line and the field, and changes nothing. Loading twice changes nothing.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from django.db import transaction

from .choices import Engine
from .models import GPUClass, Model, OriginFile, Profile, name_validator

MODEL_KEYS = {"name", "source", "context_length", "max_output", "origin", "profiles"}
ORIGIN_KEYS = {"repo", "revision", "files"}
PROFILE_KEYS = {"name", "engine", "args", "gpu_class", "gpus_per_node", "tp", "pp", "nodes", "cpu_only", "min_memory_gb"}
PROFILE_INTS = {"gpus_per_node": 0, "tp": 1, "pp": 1, "nodes": 1, "min_memory_gb": 0}


class ClusterFileError(ValueError):
    """A cluster file that cannot be loaded, with where: `path:line: field: what is wrong`."""


@dataclass
class LoadResult:
    created: list[str]
    updated: list[str]
    unchanged: list[str]
    undeclared: list[str]


class _Locator:
    """Finds the line of a field in the file's text: tomllib gives values, not positions."""

    def __init__(self, text: str):
        self.lines = text.splitlines()

    def _headers(self, pattern: str) -> list[int]:
        rx = re.compile(pattern)
        return [i for i, line in enumerate(self.lines) if rx.match(line)]

    def line(self, model: int, key: str | None = None, profile: int | None = None) -> int:
        models = self._headers(r"^\s*\[\[\s*models\s*\]\]")
        if model >= len(models):
            return 1
        start = models[model]
        end = models[model + 1] if model + 1 < len(models) else len(self.lines)
        if profile is not None:
            profiles = [i for i in self._headers(r"^\s*\[\[\s*models\.profiles\s*\]\]") if start < i < end]
            if profile >= len(profiles):
                return start + 1
            start = profiles[profile]
            following = [i for i in self._headers(r"^\s*\[") if i > start]
            end = min([end, *following])
        if key:
            rx = re.compile(rf"^\s*{re.escape(key)}\s*=")
            for i in range(start + 1, end):
                if rx.match(self.lines[i]):
                    return i + 1
        return start + 1


def _int(value, field: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field} must be a whole number, not {value!r}")
    if value < minimum:
        raise ValueError(f"{field} must be at least {minimum}, not {value}")
    return value


def parse(text: str, path: str = "<cluster file>") -> list[dict]:
    """The declared models as plain dicts, validated; ClusterFileError on the first problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line = getattr(e, "lineno", None) or (re.search(r"line (\d+)", str(e)) or [None, "1"])[1]
        raise ClusterFileError(f"{path}:{line}: {e}") from e
    where = _Locator(text)
    gpu_classes = set(GPUClass.objects.values_list("name", flat=True))

    def fail(msg: str, model: int, key: str | None = None, profile: int | None = None):
        raise ClusterFileError(f"{path}:{where.line(model, key, profile)}: {msg}")

    unknown_top = set(data) - {"models"}
    if unknown_top:
        raise ClusterFileError(f"{path}:1: unknown table or key {sorted(unknown_top)[0]!r} (expected [[models]])")
    models = data.get("models", [])
    if not isinstance(models, list):
        raise ClusterFileError(f"{path}:1: models must be an array of tables ([[models]])")
    seen: set[str] = set()
    out = []
    for mi, m in enumerate(models):
        for key in m:
            if key not in MODEL_KEYS:
                fail(f"models[{mi}]: unknown field {key!r}", mi, key)
        name = m.get("name")
        if not isinstance(name, str) or not name:
            fail(f"models[{mi}].name: every model needs a name", mi, "name")
        try:
            name_validator(name)
        except Exception:
            fail(f"models[{mi}].name: {name!r} is not a valid name (letters, digits, . _ : -)", mi, "name")
        if name in seen:
            fail(f"models[{mi}].name: {name!r} is declared twice", mi, "name")
        seen.add(name)
        model = {"name": name, "source": m.get("source", ""), "repo": "", "revision": "", "files": [], "profiles": []}
        if not isinstance(model["source"], str):
            fail(f"{name}.source: must be a string", mi, "source")
        for key, default in (("context_length", 0), ("max_output", 0)):
            try:
                model[key] = _int(m.get(key, default), f"{name}.{key}")
            except ValueError as e:
                fail(str(e), mi, key)
        if model["max_output"] and model["context_length"] and model["max_output"] > model["context_length"]:
            fail(f"{name}.max_output: an answer of {model['max_output']} tokens does not fit a context of {model['context_length']}", mi, "max_output")
        origin = m.get("origin", {})
        if not isinstance(origin, dict):
            fail(f"{name}.origin: must be a table", mi, "origin")
        for key in origin:
            if key not in ORIGIN_KEYS:
                fail(f"{name}.origin: unknown field {key!r}", mi, "origin")
        model["repo"] = origin.get("repo", "")
        model["revision"] = origin.get("revision", "")
        if not isinstance(model["repo"], str) or not isinstance(model["revision"], str):
            fail(f"{name}.origin: repo and revision are strings", mi, "origin")
        for fi, f in enumerate(origin.get("files", [])):
            if not isinstance(f, dict) or not isinstance(f.get("path"), str) or set(f) - {"path", "size"}:
                fail(f"{name}.origin.files[{fi}]: each file is {{ path = \"…\", size = bytes }}", mi, "origin")
            try:
                model["files"].append((f["path"], _int(f.get("size"), f"{name}.origin.files[{fi}].size")))
            except ValueError as e:
                fail(str(e), mi, "origin")
        if not model["source"] and not model["repo"]:
            fail(f"{name}: needs a source (GGUF) or an origin repo", mi)
        profile_names: set[str] = set()
        for pi, p in enumerate(m.get("profiles", [])):
            for key in p:
                if key not in PROFILE_KEYS:
                    fail(f"{name}.profiles[{pi}]: unknown field {key!r}", mi, key, pi)
            pname = p.get("name")
            if not isinstance(pname, str) or not pname:
                fail(f"{name}.profiles[{pi}].name: every profile needs a name", mi, "name", pi)
            if pname in profile_names:
                fail(f"{name}.profiles[{pi}].name: {pname!r} is declared twice", mi, "name", pi)
            profile_names.add(pname)
            engine = p.get("engine")
            if engine not in Engine.values:
                fail(f"{name}/{pname}.engine: {engine!r} is not one of {', '.join(Engine.values)}", mi, "engine", pi)
            args = p.get("args", [])
            if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                fail(f"{name}/{pname}.args: must be a list of strings", mi, "args", pi)
            gpu_class = p.get("gpu_class", "")
            if gpu_class and gpu_class not in gpu_classes:
                fail(f"{name}/{pname}.gpu_class: no GPU class {gpu_class!r} (known: {', '.join(sorted(gpu_classes))})", mi, "gpu_class", pi)
            cpu_only = p.get("cpu_only", False)
            if not isinstance(cpu_only, bool):
                fail(f"{name}/{pname}.cpu_only: must be true or false", mi, "cpu_only", pi)
            if not cpu_only and not gpu_class:
                fail(f"{name}/{pname}: a profile runs on a gpu_class or is cpu_only = true", mi, "gpu_class", pi)
            profile = {"name": pname, "engine": engine, "args": args, "gpu_class": gpu_class or None, "cpu_only": cpu_only}
            for key, default in PROFILE_INTS.items():
                try:
                    profile[key] = _int(p.get(key, default), f"{name}/{pname}.{key}", 1 if default == 1 else 0)
                except ValueError as e:
                    fail(str(e), mi, key, pi)
            model["profiles"].append(profile)
        out.append(model)
    return out


def load(path: str | Path) -> LoadResult:
    """Load the cluster file into the catalog, all or nothing."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ClusterFileError(f"{path}: cannot read it ({e.strerror})") from e
    except UnicodeDecodeError as e:
        raise ClusterFileError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    declared = parse(text, str(path))
    classes = {g.name: g for g in GPUClass.objects.all()}
    result = LoadResult([], [], [], [])
    with transaction.atomic():
        clashes = Model.objects.filter(name__in=[m["name"] for m in declared], declared=False)
        if clashes.exists():
            names = ", ".join(clashes.values_list("name", flat=True))
            raise ClusterFileError(f"{path}: {names} already exist(s) in the catalog and are not declared: rename or remove them first")
        for m in declared:
            model, created = Model.objects.get_or_create(
                name=m["name"],
                defaults={"declared": True, "source": m["source"], "origin_repo": m["repo"], "origin_revision": m["revision"],
                          "context_length": m["context_length"], "max_output": m["max_output"]},
            )
            changed = created
            for field, key in (("source", "source"), ("origin_repo", "repo"), ("origin_revision", "revision"),
                               ("context_length", "context_length"), ("max_output", "max_output")):
                if getattr(model, field) != m[key]:
                    setattr(model, field, m[key])
                    changed = True
            if changed:
                model.declared = True
                model.save()
            files = dict(model.files.values_list("path", "size"))
            if files != dict(m["files"]):
                model.files.all().delete()
                OriginFile.objects.bulk_create(OriginFile(model=model, path=p, size=s) for p, s in m["files"])
                changed = True
            existing = {p.name: p for p in model.profiles.all()}
            for p in m["profiles"]:
                values = {**p, "gpu_class": classes.get(p["gpu_class"]) if p["gpu_class"] else None}
                row = existing.pop(p["name"], None)
                if row is None:
                    Profile.objects.create(model=model, **values)
                    changed = True
                elif any(getattr(row, k) != v for k, v in values.items()):
                    for k, v in values.items():
                        setattr(row, k, v)
                    row.save()
                    changed = True
            for gone in existing.values():
                gone.delete()
                changed = True
            (result.created if created else result.updated if changed else result.unchanged).append(model.name)
        stale = Model.objects.filter(declared=True).exclude(name__in=[m["name"] for m in declared])
        result.undeclared = list(stale.values_list("name", flat=True))
        stale.update(declared=False)
    return result
