"""Streaming GGUF header reader (local file or HTTP ``Range`` requests).

Pure Python, no Django.  Reads only the header (metadata key/values and tensor
infos), never tensor data, in growing chunks, with a parser that *suspends* when
it runs out of buffered bytes and resumes where it stopped once more bytes
arrived (it is a generator), so nothing is ever re-parsed.

Layout (see /work/shared/reference/kv-memory.md §2.1)::

    u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv      x { string key | u32 value_type | value }
    n_tensors x { string name | u32 n_dims | n_dims x u64 ne | u32 ggml_type | u64 offset }
    padding to general.alignment (default 32) | tensor data

Only the ``gguf`` package's constants are used (``GGUFValueType``,
``GGML_QUANT_SIZES``); its ``GGUFReader`` needs a whole file and is not used.

Chunk policy
------------
The first request fetches ``first_chunk`` bytes (default 1 MiB, at most 4 MiB).
Whenever the parser needs bytes beyond what is buffered, the next request is
sized from what the parser already knows: the counts of the open arrays and
the size of their elements so far (with the growth trend of long string
arrays: BPE tokens and merges get longer with their rank), the tokenizer
arrays that usually follow the token list (token_type; scores for SPM, about
as many merges as tokens for BPE), and the number of key/values and tensor
infos still to come.  The request ends ``5/8 * first_chunk`` past that estimate
of the end of the header, and always covers what the parser needs right now.
Every request but the last one ends inside the header, so the over-read is the
slack of the last request: below ``first_chunk`` unless the estimate overshoots
the real end by more than ``3/8 * first_chunk`` (estimates lean low; a low one
costs one more request, not more bytes).  Nothing is read past ``max_header``.
"""

from __future__ import annotations

import math
import os
import re
import struct
import time
from dataclasses import dataclass, field
from typing import Generator

import httpx
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

__all__ = [
    "GGUFError",
    "ArraySummary",
    "TensorInfo",
    "GGUFHeader",
    "read_header",
    "split_shard_names",
]

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
MAX_NESTING = 8
# Arrays longer than this, and the tokenizer arrays below, are stepped over and
# kept as an ArraySummary instead of a Python list.
KEEP_ARRAY_MAX = 1 << 16
# Total number of array elements kept as Python objects over a whole header.
KEEP_ELEMENTS_BUDGET = 1 << 20
_TOKENS = "tokenizer.ggml.tokens"
_TOKEN_TYPE = "tokenizer.ggml.token_type"
_SCORES = "tokenizer.ggml.scores"
_MERGES = "tokenizer.ggml.merges"
_MARK_EVERY = 4096
_MARK_MASK = _MARK_EVERY - 1
SUMMARISED_KEYS = frozenset(
    {
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.scores",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.precompiled_charsmap",
    }
)

_SPLIT_RE = re.compile(r"^(?P<prefix>.*)-(?P<k>\d{5})-of-(?P<n>\d{5})\.gguf$")

_VT = GGUFValueType
# value type -> (struct code, size) for fixed-size scalars
_FIXED: dict[int, tuple[str, int]] = {
    int(_VT.UINT8): ("B", 1),
    int(_VT.INT8): ("b", 1),
    int(_VT.UINT16): ("H", 2),
    int(_VT.INT16): ("h", 2),
    int(_VT.UINT32): ("I", 4),
    int(_VT.INT32): ("i", 4),
    int(_VT.FLOAT32): ("f", 4),
    int(_VT.BOOL): ("B", 1),
    int(_VT.UINT64): ("Q", 8),
    int(_VT.INT64): ("q", 8),
    int(_VT.FLOAT64): ("d", 8),
}
_STRING = int(_VT.STRING)
_ARRAY = int(_VT.ARRAY)
_BOOL = int(_VT.BOOL)


def _min_size(vtype: int) -> int:
    """Smallest encoding of one value of this type (for sanity-checking counts)."""
    if vtype == _STRING:
        return 8
    if vtype == _ARRAY:
        return 12
    return _FIXED[vtype][1]


class GGUFError(Exception):
    """Every failure of the reader (bad input, limits, network)."""


@dataclass(frozen=True)
class ArraySummary:
    """Stand-in for an array that was stepped over, not materialised."""

    type: int  # GGUFValueType of the elements
    count: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGML order: ne[0] (innermost) first
    ggml_type: int
    offset: int  # relative to data_offset


@dataclass
class GGUFHeader:
    version: int
    little_endian: bool
    metadata: dict[str, object]
    tensors: list[TensorInfo]
    data_offset: int
    file_size: int
    header_bytes: int
    bytes_read: int
    requests: int
    architecture: str
    warnings: list[str] = field(default_factory=list)
    shard_sizes: list[int] = field(default_factory=list)
    source: str = ""

    def get(self, key: str, default: object = None) -> object:
        return self.metadata.get(key, default)

    def arch_key(self, suffix: str, default: object = None) -> object:
        """``arch_key("context_length")`` -> ``metadata[f"{arch}.context_length"]``."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)


# --------------------------------------------------------------------------
# Incremental parser
# --------------------------------------------------------------------------


class _Parser:
    """Resumable parser over a growing buffer that always starts at offset 0.

    ``run()`` is a generator: it yields the absolute offset the buffer must
    reach before it can go on; the driver appends bytes to ``self.buf`` and
    resumes it.  When it returns, the result attributes are set.
    """

    def __init__(self, limit: int, max_array: int, max_string: int, max_header: int):
        self.buf = bytearray()
        self.pos = 0
        self.limit = limit  # header cannot extend past this (min(file size, max_header))
        self.max_array = max_array
        self.max_string = max_string
        self.max_header = max_header
        self.e = "<"
        self.version = 0
        self.n_kv = 0
        self.n_tensors = 0
        self.kv_done = 0
        self.kv_bytes = 0  # bytes of completed key/values that are not big arrays
        self.kv_small = 0
        self.ti_done = 0
        self.ti_start = 0
        self.frames: list[list[int]] = []  # [start, count, index, elem_min]
        self.metadata: dict[str, object] = {}
        self.tensors: list[TensorInfo] = []
        self.warnings: list[str] = []
        self.keep_budget = KEEP_ELEMENTS_BUDGET
        self.data_offset = 0
        self.alignment = DEFAULT_ALIGNMENT
        self._key = ""
        self.vocab_count = 0  # len(tokenizer.ggml.tokens) once its array header was read
        self.vocab_avg = 0.0  # bytes per token element once the array is done
        self._predicted_n = 0

    # -- helpers -----------------------------------------------------------

    def _short(self, n: int, what: str) -> int:
        """Absolute offset needed for ``n`` more bytes; error if past the limit."""
        end = self.pos + n
        if end > self.limit:
            if self.limit >= self.max_header and end > self.max_header:
                raise GGUFError(
                    f"header exceeds max_header={self.max_header} bytes "
                    f"({what} at offset {self.pos} needs {n} bytes)"
                )
            raise GGUFError(
                f"truncated file: {what} at offset {self.pos} needs {n} bytes "
                f"but the file ends at {self.limit}"
            )
        return end

    def _check_count(self, count: int, unit: int, what: str) -> None:
        """Refuse a count before anything is allocated from it."""
        need = count * unit
        room = self.limit - self.pos
        if need <= room:
            return
        if self.limit >= self.max_header and self.pos + need > self.max_header:
            raise GGUFError(
                f"header exceeds max_header={self.max_header} bytes: {what}={count} at offset "
                f"{self.pos} needs at least {need} bytes"
            )
        raise GGUFError(
            f"absurd {what}={count} at offset {self.pos}: needs at least {need} bytes but only "
            f"{room} remain in the file (truncated or corrupt)"
        )

    def _u32(self) -> Generator[int, None, int]:
        if len(self.buf) < self.pos + 4:
            yield self._short(4, "u32")
        (v,) = struct.unpack_from(self.e + "I", self.buf, self.pos)
        self.pos += 4
        return v

    def _u64(self) -> Generator[int, None, int]:
        if len(self.buf) < self.pos + 8:
            yield self._short(8, "u64")
        (v,) = struct.unpack_from(self.e + "Q", self.buf, self.pos)
        self.pos += 8
        return v

    def _name(self, what: str) -> Generator[int, None, str]:
        """Key or tensor name: strict UTF-8."""
        start = self.pos
        n = yield from self._u64()
        if n > self.max_string:
            raise GGUFError(f"{what} at offset {start}: length {n} exceeds max_string={self.max_string}")
        if len(self.buf) < self.pos + n:
            yield self._short(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFError(f"{what} at offset {start} is not valid UTF-8: {exc}") from None

    def _string_value(self) -> Generator[int, None, str]:
        start = self.pos
        n = yield from self._u64()
        if n > self.max_string:
            raise GGUFError(
                f"string in {self._key!r} at offset {start}: length {n} exceeds max_string={self.max_string}"
            )
        if len(self.buf) < self.pos + n:
            yield self._short(n, f"string in {self._key!r}")
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return self._decode(raw, start)

    def _decode(self, raw: bytes, start: int) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.warnings.append(
                f"invalid UTF-8 in string of {self._key!r} at offset {start}; decoded with replacement characters"
            )
            return raw.decode("utf-8", errors="replace")

    def _value(self, vtype: int, depth: int) -> Generator[int, None, object]:
        fx = _FIXED.get(vtype)
        if fx is not None:
            code, size = fx
            if len(self.buf) < self.pos + size:
                yield self._short(size, f"value of {self._key!r}")
            (v,) = struct.unpack_from(self.e + code, self.buf, self.pos)
            self.pos += size
            return bool(v) if vtype == _BOOL else v
        if vtype == _STRING:
            return (yield from self._string_value())
        if vtype == _ARRAY:
            return (yield from self._array(depth + 1))
        raise GGUFError(f"unknown value type {vtype} for key {self._key!r} at offset {self.pos - 4}")

    def _array(self, depth: int, keep: bool = True) -> Generator[int, None, object]:
        if depth > MAX_NESTING:
            raise GGUFError(f"arrays nested deeper than {MAX_NESTING} in {self._key!r} at offset {self.pos}")
        start = self.pos
        etype = yield from self._u32()
        if etype not in _FIXED and etype not in (_STRING, _ARRAY):
            raise GGUFError(f"unknown array element type {etype} for key {self._key!r} at offset {start}")
        count = yield from self._u64()
        if count > self.max_array:
            raise GGUFError(
                f"array {self._key!r} at offset {start} has {count} elements, over max_array={self.max_array}"
            )
        self._check_count(count, _min_size(etype), f"array count of {self._key!r}")
        keep = (
            keep
            and self._key not in SUMMARISED_KEYS
            and count <= KEEP_ARRAY_MAX
            and count <= self.keep_budget
        )
        if keep:
            self.keep_budget -= count
        if depth == 1 and self._key == _TOKENS and etype == _STRING:
            self.vocab_count = count
        frame: list = [self.pos, count, 0, _min_size(etype), []]
        self.frames.append(frame)
        try:
            fx = _FIXED.get(etype)
            if fx is not None:
                code, size = fx
                total = count * size
                if len(self.buf) < self.pos + total:
                    yield self._short(total, f"array {self._key!r}")
                if keep:
                    vals = list(struct.unpack_from(f"{self.e}{count}{code}", self.buf, self.pos))
                    if etype == _BOOL:
                        vals = [bool(v) for v in vals]
                    out: object = vals
                else:
                    out = ArraySummary(etype, count)
                self.pos += total
                return out
            if etype == _STRING:
                out = yield from self._string_array(frame, keep)
                if depth == 1 and self._key == _TOKENS and count:
                    self.vocab_avg = (self.pos - frame[0]) / count
                return out
            # nested arrays
            items: list[object] = []
            for i in range(count):
                frame[2] = i
                items.append((yield from self._array(depth + 1, keep)))
            return items if keep else ArraySummary(etype, count)
        finally:
            self.frames.pop()

    def _string_array(self, frame: list[int], keep: bool) -> Generator[int, None, object]:
        buf = self.buf  # extended in place by the driver, never replaced
        unpack = struct.Struct(self.e + "Q").unpack_from
        max_string = self.max_string
        count = frame[1]
        pos = self.pos
        out: list[str] | None = [] if keep else None
        marks: list[int] = frame[4]  # offset of element k * _MARK_EVERY, for the size trend
        i = 0
        while i < count:
            if not i & _MARK_MASK and len(marks) * _MARK_EVERY <= i:
                marks.append(pos)
            if len(buf) < pos + 8:
                self.pos, frame[2] = pos, i
                yield self._short(8, f"string {i} of array {self._key!r}")
            (n,) = unpack(buf, pos)
            if n > max_string:
                raise GGUFError(
                    f"string {i} of array {self._key!r} at offset {pos}: length {n} exceeds max_string={max_string}"
                )
            end = pos + 8 + n
            if len(buf) < end:
                self.pos, frame[2] = pos, i
                self._check_count(8 + n, 1, f"string length of element {i} of {self._key!r}")
                yield self._short(8 + n, f"string {i} of array {self._key!r}")
            if out is not None:
                out.append(self._decode(bytes(buf[pos + 8 : end]), pos))
            pos = end
            i += 1
        self.pos = pos
        frame[2] = count
        return out if out is not None else ArraySummary(_STRING, count)

    # -- main --------------------------------------------------------------

    def run(self) -> Generator[int, None, None]:
        if len(self.buf) < 4:
            yield self._short(4, "magic")
        magic = bytes(self.buf[0:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"bad magic {magic!r} at offset 0 (expected b'GGUF'): not a GGUF file")
        self.pos = 4
        self.e = "<"
        version = yield from self._u32()
        if version & 0xFFFF == 0:
            self.e = ">"
            version = struct.unpack("<I", struct.pack(">I", version))[0]
        if version == 1:
            raise GGUFError("GGUF version 1 is not supported (only v2 and v3)")
        if version not in (2, 3):
            raise GGUFError(f"unsupported GGUF version {version} at offset 4 (only v2 and v3)")
        self.version = version
        self.n_tensors = yield from self._u64()
        self.n_kv = yield from self._u64()
        # key: u64 len (+ >=0 bytes) + u32 type + >=1 byte value; tensor info >= 8+4+4+8
        self._check_count(self.n_kv, 13, "n_kv")
        self._check_count(self.n_tensors, 24, "n_tensors")
        self._check_count(self.n_kv * 13 + self.n_tensors * 24, 1, "n_kv+n_tensors bytes")

        for i in range(self.n_kv):
            kv_start = self.pos
            self._key = f"#{i}"
            key = yield from self._name(f"key #{i}")
            self._key = key
            vtype = yield from self._u32()
            if vtype not in _FIXED and vtype not in (_STRING, _ARRAY):
                raise GGUFError(f"unknown value type {vtype} for key {key!r} at offset {self.pos - 4}")
            value = yield from self._value(vtype, 0)
            if key in self.metadata:
                raise GGUFError(f"duplicate key {key!r} at offset {kv_start}")
            self.metadata[key] = value
            self.kv_done = i + 1
            size = self.pos - kv_start
            if size < 4096:
                self.kv_bytes += size
                self.kv_small += 1

        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if (
            isinstance(align, bool)
            or not isinstance(align, int)
            or align <= 0
            or align & (align - 1)
        ):
            raise GGUFError(f"general.alignment must be a positive power of two, got {align!r}")
        self.alignment = align

        self.ti_start = self.pos
        seen: set[str] = set()
        self._key = "tensor info"
        for j in range(self.n_tensors):
            ti_off = self.pos
            name = yield from self._name(f"name of tensor #{j}")
            n_dims = yield from self._u32()
            if n_dims > GGML_MAX_DIMS:
                raise GGUFError(
                    f"tensor {name!r} at offset {ti_off} has n_dims={n_dims} (max {GGML_MAX_DIMS})"
                )
            need = 8 * n_dims + 12
            if len(self.buf) < self.pos + need:
                yield self._short(need, f"tensor info {name!r}")
            dims = struct.unpack_from(f"{self.e}{n_dims}Q", self.buf, self.pos)
            ggml_type, offset = struct.unpack_from(self.e + "IQ", self.buf, self.pos + 8 * n_dims)
            self.pos += need
            if name in seen:
                raise GGUFError(f"duplicate tensor name {name!r} at offset {ti_off}")
            seen.add(name)
            self.tensors.append(TensorInfo(name, tuple(dims), ggml_type, offset))
            self.ti_done = j + 1

        self.data_offset = -(-self.pos // align) * align

    # -- estimate of where the header ends (drives request sizes) ------------

    def estimate_end(self) -> int:
        est = self.pos
        # open arrays, innermost first: remaining elements times the element
        # size seen so far (with its trend for long string arrays)
        inner_avg = 0.0
        innermost = True
        for start, count, idx, emin, marks in reversed(self.frames):
            # innermost: element idx not started yet; outer: element idx is in progress
            remaining = count - idx if innermost else max(count - idx - 1, 0)
            done = self.pos - start
            avg = done / idx if idx > 0 else float(max(emin, inner_avg))
            per = avg
            if innermost and len(marks) >= 8 and remaining:
                per = _trend(marks, self.pos, idx, remaining, avg)
            est += int(remaining * max(per, emin))
            inner_avg, innermost = avg, False
        kv_left = max(self.n_kv - self.kv_done - 1, 0) if self.kv_done < self.n_kv else 0
        est += self._predicted_tokenizer_arrays(kv_left)
        kv_left = max(kv_left - self._predicted_n, 0)
        avg_kv = self.kv_bytes / self.kv_small if self.kv_small else 64.0
        est += int(max(kv_left, 0) * avg_kv)
        ti_left = self.n_tensors - self.ti_done
        if self.ti_done:
            avg_ti = (self.pos - self.ti_start) / self.ti_done
        else:
            avg_ti = 64.0
        est += int(ti_left * avg_ti) + DEFAULT_ALIGNMENT
        return est

    def _predicted_tokenizer_arrays(self, kv_left: int) -> int:
        """Bytes of tokenizer arrays that usually follow the token list but were not seen yet.

        llama.cpp's converters write token_type after the tokens, scores for SPM
        ("llama") vocabularies and merges for BPE ("gpt2") ones, with about as many
        merges as tokens.  Predicting them lets one request cover them; the
        prediction is kept on the low side (a merge is counted as 1.5 tokens), so
        a miss costs one more request rather than over-reading.
        """
        self._predicted_n = 0
        n = self.vocab_count
        if not n or kv_left <= 0:
            return 0
        avg = self.vocab_avg
        if not avg:  # token list in progress
            f = self.frames[0] if self.frames and self._key == _TOKENS else None
            avg = (self.pos - f[0]) / f[2] if f and f[2] else 8.0
        seen = self.metadata.keys()
        model = self.metadata.get("tokenizer.ggml.model")
        out = 0
        if _TOKEN_TYPE not in seen and self._key != _TOKEN_TYPE:
            out += 4 * n
            self._predicted_n += 1
        if model == "llama" and _SCORES not in seen and self._key != _SCORES:
            out += 4 * n
            self._predicted_n += 1
        if model == "gpt2" and _MERGES not in seen and self._key != _MERGES:
            out += int(n * (9 + 1.5 * max(avg - 8.0, 1.0)))
            self._predicted_n += 1
        if self._predicted_n > kv_left:  # cannot be more arrays than keys left
            self._predicted_n = 0
            return 0
        return out


def _trend(marks: list[int], pos: int, idx: int, remaining: int, avg: float) -> float:
    """Expected size of the remaining elements of a long string array.

    Token lists and merges are ordered by BPE rank, and later entries are
    longer: the plain average underestimates the rest.  Compare the element
    size over the last quarter of what was parsed with the quarter before it
    and extrapolate half of that slope to the middle of what remains.
    """
    k = len(marks) - 1  # marks[k] is the offset of element k * _MARK_EVERY <= idx
    q = max(k // 4, 1)
    a_end, b_end = k - q, k
    a_start = max(a_end - q, 0)
    older = (marks[a_end] - marks[a_start]) / ((a_end - a_start) * _MARK_EVERY)
    recent = (marks[b_end] - marks[a_end]) / ((b_end - a_end) * _MARK_EVERY)
    # centres of the two windows, in elements
    c_old = (a_start + a_end) / 2 * _MARK_EVERY
    c_new = (a_end + b_end) / 2 * _MARK_EVERY
    slope = (recent - older) / (c_new - c_old)
    target = idx + remaining / 2
    est = recent + 0.5 * slope * (target - c_new)
    # never below the recent size when growing, never wildly off when shrinking
    if slope >= 0:
        return max(est, recent)
    return max(est, min(recent, avg) / 2)


# --------------------------------------------------------------------------
# Byte sources
# --------------------------------------------------------------------------


class _Source:
    size: int
    bytes_read: int = 0
    requests: int = 0
    name: str = ""

    def first(self, n: int) -> bytes:  # pragma: no cover - interface
        raise NotImplementedError

    def read(self, start: int, end: int) -> bytes:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        pass


class _FileSource(_Source):
    def __init__(self, path: str):
        self.name = path
        try:
            self.f = open(path, "rb")
            self.size = os.fstat(self.f.fileno()).st_size
        except OSError as exc:
            raise GGUFError(f"cannot open {path}: {exc.strerror or exc}") from None

    def first(self, n: int) -> bytes:
        return self.read(0, min(n, self.size))

    def read(self, start: int, end: int) -> bytes:
        try:
            self.f.seek(start)
            data = self.f.read(end - start)
        except OSError as exc:
            raise GGUFError(f"cannot read {self.name} at offset {start}: {exc}") from None
        self.requests += 1
        self.bytes_read += len(data)
        if len(data) != end - start:
            raise GGUFError(f"truncated file {self.name}: short read at offset {start}")
        return data

    def close(self) -> None:
        self.f.close()


_CONTENT_RANGE_RE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.I)


class _HttpSource(_Source):
    def __init__(self, url: str, client: httpx.Client, timeout: float, deadline: float, total_timeout: float):
        self.name = url
        self.client = client
        self.timeout = timeout
        self.deadline = deadline
        self.total_timeout = total_timeout
        self.size = -1

    def _remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise GGUFError(f"reading {self.name} took longer than the overall deadline of {self.total_timeout:g}s")
        return left

    def first(self, n: int) -> bytes:
        return self._get(0, n)

    def read(self, start: int, end: int) -> bytes:
        return self._get(start, end)

    def _get(self, start: int, end: int) -> bytes:
        t = min(self.timeout, self._remaining())
        headers = {"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
        self.requests += 1
        try:
            with self.client.stream(
                "GET",
                self.name,
                headers=headers,
                timeout=httpx.Timeout(t),
                follow_redirects=True,
            ) as r:
                status = r.status_code
                if status == 200:
                    raise GGUFError(
                        f"server does not honour Range requests for {self.name} "
                        f"(HTTP 200 with the whole body instead of 206 Partial Content)"
                    )
                if status == 416:
                    raise GGUFError(
                        f"HTTP 416 Range Not Satisfiable for {self.name} (bytes {start}-{end - 1}); "
                        f"file empty or truncated ({r.headers.get('content-range', 'no Content-Range')})"
                    )
                if status != 206:
                    raise GGUFError(f"HTTP {status} {r.reason_phrase} for {self.name}")
                enc = r.headers.get("content-encoding", "identity").lower()
                if enc not in ("", "identity"):
                    raise GGUFError(f"server sent Content-Encoding {enc!r} for a Range request to {self.name}")
                cr = r.headers.get("content-range")
                m = _CONTENT_RANGE_RE.match(cr or "")
                if not m:
                    raise GGUFError(f"missing or invalid Content-Range {cr!r} from {self.name}")
                a, b, total = int(m.group(1)), int(m.group(2)), m.group(3)
                if total == "*":
                    raise GGUFError(f"Content-Range {cr!r} from {self.name} does not give the file size")
                total_i = int(total)
                if self.size < 0:
                    self.size = total_i
                elif total_i != self.size:
                    raise GGUFError(f"{self.name} changed size during the read ({self.size} -> {total_i})")
                want_end = min(end, total_i)
                if a != start or b + 1 != want_end:
                    raise GGUFError(
                        f"server answered Content-Range {cr!r} to Range bytes={start}-{end - 1} for {self.name}"
                    )
                expected = want_end - start
                out = bytearray()
                for chunk in r.iter_raw():
                    out += chunk
                    self.bytes_read += len(chunk)
                    if len(out) > expected:
                        raise GGUFError(f"server sent more than the {expected} bytes requested from {self.name}")
                    self._remaining()
                if len(out) != expected:
                    raise GGUFError(
                        f"short response from {self.name}: got {len(out)} of {expected} bytes at offset {start}"
                    )
                return bytes(out)
        except httpx.TimeoutException as exc:
            if time.monotonic() >= self.deadline:
                raise GGUFError(
                    f"reading {self.name} took longer than the overall deadline of {self.total_timeout:g}s"
                ) from None
            raise GGUFError(f"timed out after {t:g}s reading {self.name} ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            raise GGUFError(f"HTTP error reading {self.name}: {type(exc).__name__}: {exc}") from None


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


def _is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def split_shard_names(source: str) -> list[str] | None:
    """For ``x-0000k-of-0000n.gguf`` (path or URL) the names of all n shards, else None."""
    if _is_url(source):
        url = httpx.URL(source)
        path = url.path
        m = _SPLIT_RE.match(path)
        if not m:
            return None
        n = int(m.group("n"))
        return [str(url.copy_with(path=f"{m.group('prefix')}-{k:05d}-of-{n:05d}.gguf")) for k in range(1, n + 1)]
    m = _SPLIT_RE.match(source)
    if not m:
        return None
    n = int(m.group("n"))
    return [f"{m.group('prefix')}-{k:05d}-of-{n:05d}.gguf" for k in range(1, n + 1)]


def _parse_from(src: _Source, first_chunk: int, max_header: int, max_array: int, max_string: int) -> _Parser:
    data = src.first(min(first_chunk, max_header))  # never buffer past max_header
    size = src.size
    parser = _Parser(min(size, max_header), max_array, max_string, max_header)
    parser.buf += data
    gen = parser.run()
    margin = max(first_chunk * 5 // 8, 1)
    try:
        need = next(gen)
        while True:
            have = len(parser.buf)
            # need <= parser.limit is guaranteed by the parser (it raises otherwise)
            target = max(need, parser.estimate_end() + margin)
            target = min(target, parser.limit)
            parser.buf += src.read(have, target)
            need = gen.send(None)
            while need <= len(parser.buf):  # defensive: parser should not ask for what it has
                need = gen.send(None)
    except StopIteration:
        pass
    except (struct.error, OverflowError, MemoryError, RecursionError) as exc:  # belt and braces
        raise GGUFError(f"malformed GGUF header near offset {parser.pos}: {type(exc).__name__}: {exc}") from None
    return parser


def _tensor_nbytes(t: TensorInfo) -> int | None:
    try:
        block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(t.ggml_type)]
    except (ValueError, KeyError):
        return None
    n = math.prod(t.shape) if t.shape else 1
    return (n // block) * nbytes


def _open(source: str, client: httpx.Client | None, timeout: float, deadline: float, total_timeout: float,
          owned: list[httpx.Client]) -> _Source:
    if _is_url(source):
        if client is None:
            if not owned:
                owned.append(httpx.Client(timeout=timeout, follow_redirects=True))
            client = owned[0]
        return _HttpSource(source, client, timeout, deadline, total_timeout)
    return _FileSource(source)


def read_header(
    source: str,
    *,
    timeout: float = 10.0,
    first_chunk: int = 1 << 20,
    client: httpx.Client | None = None,
    max_header: int = 64 << 20,
    max_array: int = 10**7,
    max_string: int = 16 << 20,
    total_timeout: float | None = None,
) -> GGUFHeader:
    """Read the header of a GGUF file (local path or http(s) URL).

    ``timeout`` bounds each connect/read; ``total_timeout`` (default
    ``6 * timeout``) bounds the whole call.  For a split model
    (``name-0000k-of-0000n.gguf``) the metadata and tensor infos come from
    shard 1 and ``file_size`` is the sum of all shards.
    """
    source = os.fspath(source)
    if first_chunk <= 0 or first_chunk > 4 << 20:
        raise GGUFError(f"first_chunk must be in 1..{4 << 20} bytes, got {first_chunk}")
    total_timeout = 6 * timeout if total_timeout is None else total_timeout
    deadline = time.monotonic() + total_timeout
    shards = split_shard_names(source)
    first = shards[0] if shards else source
    owned: list[httpx.Client] = []
    bytes_read = requests = 0
    try:
        src = _open(first, client, timeout, deadline, total_timeout, owned)
        try:
            parser = _parse_from(src, first_chunk, max_header, max_array, max_string)
        finally:
            src.close()
            bytes_read += src.bytes_read
            requests += src.requests
        if src.size == 0:
            raise GGUFError(f"empty file {first}")
        sizes = [src.size]
        md = parser.metadata
        count = md.get("split.count")
        if shards:
            if count is not None and count != len(shards):
                raise GGUFError(
                    f"split.count={count!r} in {first} but the file name says {len(shards)} shards"
                )
            for other in shards[1:]:
                s = _open(other, client, timeout, deadline, total_timeout, owned)
                try:
                    if isinstance(s, _HttpSource):
                        s.first(1)
                    sizes.append(s.size)
                finally:
                    s.close()
                    bytes_read += s.bytes_read
                    requests += s.requests
        elif isinstance(count, int) and not isinstance(count, bool) and count > 1:
            raise GGUFError(
                f"{first} is shard of a {count}-way split (split.count) but its name does not "
                f"follow the -0000k-of-0000n.gguf pattern, so the other shards cannot be found"
            )
    finally:
        for c in owned:
            c.close()

    arch = md.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise GGUFError(f"{first}: missing or invalid general.architecture ({arch!r})")
    # data of the first shard's tensors must lie within the first shard
    data_room = sizes[0] - parser.data_offset
    for t in parser.tensors:
        nb = _tensor_nbytes(t)
        if nb is not None and t.offset + nb > data_room:
            raise GGUFError(
                f"truncated file {first}: tensor {t.name!r} data ends at "
                f"{parser.data_offset + t.offset + nb} but the file has {sizes[0]} bytes"
            )
    return GGUFHeader(
        version=parser.version,
        little_endian=parser.e == "<",
        metadata=md,
        tensors=parser.tensors,
        data_offset=parser.data_offset,
        file_size=sum(sizes),
        header_bytes=parser.data_offset,
        bytes_read=bytes_read,
        requests=requests,
        architecture=arch,
        warnings=parser.warnings,
        shard_sizes=sizes,
        source=first,
    )
