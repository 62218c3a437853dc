"""An engine's arguments: read a flag, set a flag, keeping the form it was written in.

Both `--flag value` and `--flag=value` are recognised; a flag that is absent is appended
as `--flag value`. Aliases (llama.cpp's `-c` for `--ctx-size`) are read and rewritten in
place, so an admin's own spelling survives a change."""

from __future__ import annotations

import functools


def _looks_like_flag(a: str) -> bool:
    """`--x`, `--` or `-x`: never a flag's value (a negative number such as `-1` is one)."""
    return a.startswith("--") or (len(a) > 1 and a[0] == "-" and a[1].isalpha())


@functools.lru_cache(maxsize=4096)
def _scan(args: tuple[str, ...]) -> tuple[dict[str, tuple[int, bool]], frozenset[str]]:
    """One pass over an argument list: each flag given a value → (the index of its last
    occurrence, written with '='), and every flag present. A name followed by another flag
    has no value, so that flag is not taken for it (and not overwritten by set_arg).
    Cached: a preview reads the same few lists a dozen times each."""
    valued: dict[str, tuple[int, bool]] = {}
    present = set()
    last = len(args) - 1
    for i, a in enumerate(args):
        if not a.startswith("-"):  # a value
            continue
        name, eq, _ = a.partition("=")
        present.add(name)
        if eq:
            valued[name] = (i, True)
        elif i < last and not _looks_like_flag(args[i + 1]):
            valued[name] = (i, False)
    return valued, frozenset(present)


def _find(args: list[str], names: tuple[str, ...]) -> tuple[int, str, bool] | None:
    """Where a flag is: (index, the name used, written with '='); of its names (aliases) the
    last occurrence wins, as it does for the engines' argument parsers."""
    valued = _scan(args if type(args) is tuple else tuple(args))[0]
    found = None
    for name in names:
        at = valued.get(name)
        if at is not None and (found is None or at[0] > found[0]):
            found = (at[0], name, at[1])
    return found


def get_arg(args: list[str], *names: str) -> str | None:
    """A flag's value, None when absent."""
    at = _find(args, names)
    if at is None:
        return None
    i, name, eq = at
    return args[i][len(name) + 1 :] if eq else args[i + 1]


def flag_name(args: list[str], *names: str) -> str | None:
    """Which of a flag's names (aliases) it is given a value with, None when absent: the
    spelling set_arg keeps."""
    at = _find(args, names)
    return at[1] if at is not None else None


def get_int(args: list[str], *names: str) -> int:
    """A flag's whole-number value, 0 when absent or not a number."""
    value = get_arg(args, *names)
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def has_flag(args: list[str], *names: str) -> bool:
    """Whether a flag without a value (e.g. `--swa-full`) is present."""
    present = _scan(args if type(args) is tuple else tuple(args))[1]
    return any(n in present for n in names)


def set_arg(args: list[str], value: str, *names: str) -> list[str]:
    """A copy of args with the flag set to value, in the form and spelling it had;
    appended as `names[0] value` when absent."""
    out = list(args)
    at = _find(out, names)
    if at is None:
        return out + [names[0], value]
    i, name, eq = at
    if eq:
        out[i] = f"{name}={value}"
    else:
        out[i + 1] = value
    return out
