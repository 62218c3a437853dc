"""Tests of the streaming GGUF header reader (no Django needed)."""

from __future__ import annotations

import math
import os
import random
import re
import socket
import struct
import threading
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from catalog.domain import gguf as G
from catalog.domain.gguf import ArraySummary, GGUFError, TensorInfo, read_header

VT = gguf.GGUFValueType


# ---------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------

ALL_TYPES_KV = [
    ("t.u8", 250, VT.UINT8),
    ("t.i8", -7, VT.INT8),
    ("t.u16", 65000, VT.UINT16),
    ("t.i16", -30000, VT.INT16),
    ("t.u32", 4_000_000_000, VT.UINT32),
    ("t.i32", -2_000_000_000, VT.INT32),
    ("t.f32", 0.5, VT.FLOAT32),
    ("t.bool_t", True, VT.BOOL),
    ("t.bool_f", False, VT.BOOL),
    ("t.str", "héllo wörld ✓", VT.STRING),
    ("t.empty_str", "", VT.STRING),
    ("t.u64", 2**63 + 12345, VT.UINT64),
    ("t.i64", -(2**62), VT.INT64),
    ("t.f64", 1e300, VT.FLOAT64),
]


DEFAULT_TENSORS = {
    "token_embd.weight": np.arange(64, dtype=np.float32).reshape(8, 8),
    "blk.0.attn_q.weight": np.ones((4, 6), dtype=np.float16),
    "output_norm.weight": np.zeros(8, dtype=np.float32),
}


def write_gguf(
    path: Path,
    *,
    arch: str = "llama",
    endian: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE,
    extra=None,
    tensors: dict[str, np.ndarray] | None = None,
    alignment: int | None = None,
) -> Path:
    w = gguf.GGUFWriter(str(path), arch, endianess=endian)
    w.add_context_length(4096)
    w.add_block_count(4)
    w.add_head_count(8)
    w.add_head_count_kv([2, 2, 4, 4])  # per-layer array (ARRAY[INT32])
    if alignment:
        w.add_custom_alignment(alignment)
    if extra:
        extra(w)
    if tensors is None:
        tensors = DEFAULT_TENSORS
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def add_all_types(w: gguf.GGUFWriter) -> None:
    for key, val, vt in ALL_TYPES_KV:
        w.add_key_value(key, val, vt)
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_key_value("t.arr_u8", [1, 2, 255], VT.ARRAY, sub_type=VT.UINT8)
    w.add_key_value("t.arr_u64", [2**40, 7], VT.ARRAY, sub_type=VT.UINT64)
    w.add_key_value("t.arr_f64", [0.25, -1.5], VT.ARRAY, sub_type=VT.FLOAT64)
    w.add_array("t.arr_bool", [True, False, True])
    w.add_array("t.arr_str", ["a", "", "βγ", "long " * 20])
    w.add_array("t.nested", [[1, 2], [3], [4, 5, 6]])
    w.add_array("t.nested_str", [["x", "y"], ["z"]])
    w.add_array("t.nested3", [[[1.5, 2.5]], [[3.5]]])
    w.add_token_list(["<s>", "</s>", "a", "b", "ab"])
    w.add_token_scores([0.0, 0.0, -1.0, -2.0, -3.0])
    w.add_token_types([3, 3, 1, 1, 1])
    w.add_token_merges(["a b"])
    w.add_string("t.after_tokens", "still parsed")


def vocab_writer_extra(n_tokens: int, n_merges: int, *, scores: bool = False, seed: int = 1):
    """Tokenizer like Qwen/Llama-3 (BPE tokens + merges) or Llama-2 (SPM: scores)."""
    rnd = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyzĠ0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_.,"

    def tok() -> str:
        return "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 10)))

    tokens = [tok() for _ in range(n_tokens)]
    merges = [f"{tok()} {tok()}" for _ in range(n_merges)]

    def extra(w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model("gpt2" if n_merges else "llama")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        if scores:
            w.add_token_scores([float(-i) for i in range(n_tokens)])
        w.add_token_types([1] * n_tokens)
        if n_merges:
            w.add_token_merges(merges)
        w.add_bos_token_id(n_tokens - 2)
        w.add_eos_token_id(n_tokens - 1)
        w.add_string("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}")

    return extra


def reader_data_offset(path: Path) -> int:
    """Independent oracle: gguf-py's own (whole-file) reader (slow on big vocabularies)."""
    return gguf.GGUFReader(str(path)).data_offset


def data_offset_from_size(path: Path, tensors: dict[str, np.ndarray], alignment: int = 32) -> int:
    """Independent oracle: tensor data fills the end of the file, each padded to the alignment."""
    return path.stat().st_size - sum(-(-a.nbytes // alignment) * alignment for a in tensors.values())


# ---------------------------------------------------------------------------
# HTTP helpers (pytest-httpserver)
# ---------------------------------------------------------------------------


class RangeFiles:
    """werkzeug handler serving files with Range support, counting what it sends."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.bytes_sent = 0

    def __call__(self, request: Request) -> Response:
        self.requests.append((request.method, request.path, request.headers.get("Range")))
        data = self.files.get(request.path)
        if data is None:
            return Response("nope", status=404)
        rng = request.headers.get("Range")
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng or "")
        if not m:
            self.bytes_sent += len(data)
            return Response(data, status=200)
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) else len(data) - 1
        if a >= len(data):
            return Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
        b = min(b, len(data) - 1)
        body = data[a : b + 1]
        self.bytes_sent += len(body)
        return Response(
            body,
            status=206,
            headers={"Content-Range": f"bytes {a}-{b}/{len(data)}", "Accept-Ranges": "bytes"},
        )


@pytest.fixture
def range_server(httpserver: HTTPServer):
    handler = RangeFiles()
    httpserver.expect_request(re.compile(r"^/.*")).respond_with_handler(handler)
    return httpserver, handler


@pytest.fixture
def threaded_server():
    srv = HTTPServer(threaded=True)
    srv.start()
    yield srv
    srv.clear()
    srv.stop()


# ---------------------------------------------------------------------------
# value types, versions, endianness
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_all_value_types_v3(tmp_path, endian):
    path = write_gguf(tmp_path / "m.gguf", endian=endian, extra=add_all_types)
    h = read_header(str(path))
    assert h.version == 3
    assert h.little_endian is (endian == gguf.GGUFEndian.LITTLE)
    md = h.metadata
    for key, val, vt in ALL_TYPES_KV:
        if vt == VT.FLOAT32:
            assert md[key] == pytest.approx(val)
        else:
            assert md[key] == val, key
        if vt == VT.BOOL:
            assert isinstance(md[key], bool)
    assert md["t.arr_i32"] == [1, -2, 3]
    assert md["t.arr_u8"] == [1, 2, 255]
    assert md["t.arr_u64"] == [2**40, 7]
    assert md["t.arr_f64"] == [0.25, -1.5]
    assert md["t.arr_bool"] == [True, False, True]
    assert md["t.arr_str"] == ["a", "", "βγ", "long " * 20]
    assert md["t.nested"] == [[1, 2], [3], [4, 5, 6]]
    assert md["t.nested_str"] == [["x", "y"], ["z"]]
    assert md["t.nested3"] == [[[1.5, 2.5]], [[3.5]]]
    # tokenizer arrays are stepped over, summarised
    assert md["tokenizer.ggml.tokens"] == ArraySummary(int(VT.STRING), 5)
    assert md["tokenizer.ggml.scores"] == ArraySummary(int(VT.FLOAT32), 5)
    assert md["tokenizer.ggml.token_type"] == ArraySummary(int(VT.INT32), 5)
    assert md["tokenizer.ggml.merges"] == ArraySummary(int(VT.STRING), 1)
    assert md["t.after_tokens"] == "still parsed"
    # model keys and helpers
    assert h.architecture == "llama"
    assert h.get("llama.context_length") == 4096
    assert h.arch_key("context_length") == 4096
    assert h.arch_key("attention.head_count_kv") == [2, 2, 4, 4]
    assert h.get("missing", "dflt") == "dflt"
    # tensor infos: GGML order (ne0 first), types, offsets; data offset like gguf-py
    reader = gguf.GGUFReader(str(path))
    assert h.data_offset == reader.data_offset == h.header_bytes
    assert h.data_offset % 32 == 0
    expected = [
        TensorInfo(t.name, tuple(int(x) for x in t.shape), int(t.tensor_type), int(t.data_offset - reader.data_offset))
        for t in reader.tensors
    ]
    assert h.tensors == expected
    assert h.tensors[0] == TensorInfo("token_embd.weight", (8, 8), int(gguf.GGMLQuantizationType.F32), 0)
    assert h.tensors[1].shape == (6, 4) and h.tensors[1].ggml_type == int(gguf.GGMLQuantizationType.F16)
    assert h.file_size == path.stat().st_size
    assert h.warnings == []


def test_big_arrays_are_stepped_over_as_summaries(tmp_path):
    n = G.KEEP_ARRAY_MAX + 10

    def extra(w):
        w.add_key_value("x.big_u16", [i % 65536 for i in range(n)], VT.ARRAY, sub_type=VT.UINT16)
        w.add_array("x.big_nested", [[i, i + 1] for i in range(n)])
        w.add_array("x.big_str", [str(i) for i in range(n)])
        w.add_string("x.after", "ok")

    path = write_gguf(tmp_path / "b.gguf", extra=extra)
    h = read_header(str(path), first_chunk=64 << 10)
    assert h.metadata["x.big_u16"] == ArraySummary(int(VT.UINT16), n)
    assert h.metadata["x.big_nested"] == ArraySummary(int(VT.ARRAY), n)
    assert h.metadata["x.big_str"] == ArraySummary(int(VT.STRING), n)
    assert h.metadata["x.after"] == "ok"
    assert h.data_offset == data_offset_from_size(path, DEFAULT_TENSORS)


def test_size_trend_estimate():
    every = G._MARK_EVERY
    flat = [i * every * 10 for i in range(17)]  # 10 bytes per element throughout
    assert G._trend(flat, flat[-1], 16 * every, 1000, 10.0) == pytest.approx(10.0)
    # element size growing linearly from 10 by 1 byte per `every` elements
    marks = [0]
    for k in range(16):
        marks.append(marks[-1] + every * (10 + k))
    est = G._trend(marks, marks[-1], 16 * every, 16 * every, (marks[-1]) / (16 * every))
    recent = (marks[16] - marks[12]) / (4 * every)
    assert recent < est < 10 + 16 + 16  # above the recent size, below the true end size


def test_custom_alignment(tmp_path):
    path = write_gguf(tmp_path / "a.gguf", alignment=256)
    h = read_header(str(path))
    assert h.metadata["general.alignment"] == 256
    assert h.data_offset % 256 == 0
    assert h.data_offset == reader_data_offset(path)


def _s(e: str, text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack(e + "Q", len(raw)) + raw


def hand_built(version: int = 2, e: str = "<", *, kvs=None, tensors=None, alignment=32) -> bytes:
    """GGUF bytes built by hand (independent of gguf-py's writer)."""
    if kvs is None:
        kvs = [
            (_s(e, "general.architecture"), struct.pack(e + "I", 8) + _s(e, "qwen2")),
            (_s(e, "qwen2.context_length"), struct.pack(e + "I", 4) + struct.pack(e + "I", 32768)),
            (_s(e, "qwen2.rope.freq_base"), struct.pack(e + "I", 6) + struct.pack(e + "f", 1e6)),
            (
                _s(e, "tokenizer.ggml.tokens"),
                struct.pack(e + "I", 9) + struct.pack(e + "IQ", 8, 3) + _s(e, "a") + _s(e, "bb") + _s(e, "ccc"),
            ),
            (_s(e, "qwen2.block_count"), struct.pack(e + "I", 10) + struct.pack(e + "Q", 28)),
        ]
    if tensors is None:
        tensors = [("blk.0.attn_k.weight", (896, 128), 1, 0), ("output.weight", (896,), 0, 229376)]
    out = b"GGUF" + struct.pack(e + "I", version) + struct.pack(e + "QQ", len(tensors), len(kvs))
    for k, v in kvs:
        out += k + v
    for name, dims, typ, off in tensors:
        out += _s(e, name) + struct.pack(e + "I", len(dims)) + struct.pack(f"{e}{len(dims)}Q", *dims)
        out += struct.pack(e + "IQ", typ, off)
    header = len(out)
    pad = -header % alignment
    data_size = 229376 + 896 * 4
    return out + b"\0" * pad + b"\0" * data_size, header + pad


@pytest.mark.parametrize("e", ["<", ">"])
def test_hand_built_v2(tmp_path, e):
    data, data_offset = hand_built(2, e)
    path = tmp_path / "v2.gguf"
    path.write_bytes(data)
    h = read_header(str(path))
    assert h.version == 2
    assert h.little_endian is (e == "<")
    assert h.architecture == "qwen2"
    assert h.arch_key("context_length") == 32768
    assert h.arch_key("rope.freq_base") == pytest.approx(1e6)
    assert h.arch_key("block_count") == 28
    assert h.metadata["tokenizer.ggml.tokens"] == ArraySummary(8, 3)
    assert h.tensors == [
        TensorInfo("blk.0.attn_k.weight", (896, 128), 1, 0),
        TensorInfo("output.weight", (896,), 0, 229376),
    ]
    assert h.data_offset == data_offset == h.header_bytes
    if e == "<":
        assert reader_data_offset(path) == data_offset


def test_v1_refused_and_unknown_version(tmp_path):
    data, _ = hand_built(2)
    p = tmp_path / "v1.gguf"
    p.write_bytes(data[:4] + struct.pack("<I", 1) + data[8:])
    with pytest.raises(GGUFError, match="version 1 is not supported"):
        read_header(str(p))
    p.write_bytes(data[:4] + struct.pack("<I", 7) + data[8:])
    with pytest.raises(GGUFError, match="unsupported GGUF version 7"):
        read_header(str(p))


# ---------------------------------------------------------------------------
# incremental reading, header only
# ---------------------------------------------------------------------------


def test_reads_only_header_in_growing_chunks_without_reparsing(tmp_path, monkeypatch):
    big = {"token_embd.weight": np.zeros((1024, 1024), dtype=np.float32)}  # 4 MiB of data
    rnd = random.Random(5)

    def extra(w):
        # unknown string arrays: nothing lets the reader predict them, so it must grow step by step
        for k in range(6):
            w.add_array(f"x.list{k}", ["".join("abc"[rnd.randrange(3)] for _ in range(rnd.randint(0, 20))) for _ in range(8000)])
        w.add_string("x.last", "end")

    path = write_gguf(tmp_path / "v.gguf", extra=extra, tensors=big)
    size = path.stat().st_size
    calls = {"name": 0}
    orig = G._Parser._name

    def counting(self, what):
        calls["name"] += 1
        return (yield from orig(self, what))

    monkeypatch.setattr(G._Parser, "_name", counting)
    sizes: list[int] = []
    orig_read = G._FileSource.read

    def rec(self, a, b):
        sizes.append(b - a)
        return orig_read(self, a, b)

    monkeypatch.setattr(G._FileSource, "read", rec)
    first = 16 << 10
    h = read_header(str(path), first_chunk=first)
    assert h.header_bytes == data_offset_from_size(path, big) == reader_data_offset(path)
    assert h.header_bytes > 6 * 8000 * 8
    # many reads, each needed, never beyond the header + one chunk, never the tensor data
    assert h.requests == len(sizes) >= 3
    assert h.bytes_read == sum(sizes) <= h.header_bytes + first
    assert h.bytes_read < size - 4_000_000
    assert sizes[0] == first and all(s >= first for s in sizes[1:])
    # parser resumed where it stopped: every key and tensor name parsed exactly once
    assert calls["name"] == len(h.metadata) + len(h.tensors)
    for k in range(6):
        assert len(h.metadata[f"x.list{k}"]) == 8000
    assert h.metadata["x.last"] == "end"
    other = read_header(str(path), first_chunk=4 << 20)  # one read: same result
    assert other.requests == 1
    assert (other.metadata, other.tensors, other.data_offset) == (h.metadata, h.tensors, h.data_offset)


def test_first_chunk_limit(tmp_path):
    path = write_gguf(tmp_path / "m.gguf")
    with pytest.raises(GGUFError, match="first_chunk"):
        read_header(str(path), first_chunk=8 << 20)


# ---------------------------------------------------------------------------
# bounds and malformed input
# ---------------------------------------------------------------------------


def test_limits(tmp_path):
    path = write_gguf(tmp_path / "v.gguf", extra=vocab_writer_extra(5000, 0))
    with pytest.raises(GGUFError, match=r"tokenizer\.ggml\.tokens.*5000 elements, over max_array=4999"):
        read_header(str(path), max_array=4999)
    assert read_header(str(path), max_array=5000).metadata["tokenizer.ggml.tokens"].count == 5000
    with pytest.raises(GGUFError, match=r"string in .tokenizer\.chat_template. at offset \d+: length 50 exceeds max_string=45"):
        read_header(str(path), max_string=45)
    with pytest.raises(GGUFError, match=r"header exceeds max_header=20000 bytes: array count of 'tokenizer.ggml.tokens'"):
        read_header(str(path), max_header=20000, first_chunk=4096)
    with pytest.raises(GGUFError, match=r"header exceeds max_header=50000 bytes \(string \d+ of array 'tokenizer.ggml.tokens'"):
        read_header(str(path), max_header=50000)  # first_chunk (1 MiB) > max_header: still enforced
    header = reader_data_offset(path)
    assert read_header(str(path), max_header=header).header_bytes == header


def test_truncated_everywhere(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", extra=add_all_types)
    data = path.read_bytes()
    header = reader_data_offset(path)
    cut = tmp_path / "cut.gguf"
    for n in list(range(0, 64)) + list(range(64, header, 37)):
        cut.write_bytes(data[:n])
        with pytest.raises(GGUFError, match="truncated|empty"):
            read_header(str(cut), first_chunk=64)
        with pytest.raises(GGUFError, match="truncated|empty"):
            read_header(str(cut), first_chunk=1 << 20)
    # header intact but tensor data cut off
    cut.write_bytes(data[: header + 10])
    with pytest.raises(GGUFError, match="truncated file.*token_embd.weight"):
        read_header(str(cut))


def test_bad_magic_and_missing_file(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGML" + b"\0" * 100)
    with pytest.raises(GGUFError, match="bad magic"):
        read_header(str(p))
    with pytest.raises(GGUFError, match="cannot open"):
        read_header(str(tmp_path / "nope.gguf"))


def test_unknown_value_type(tmp_path):
    e = "<"
    kvs = [
        (_s(e, "general.architecture"), struct.pack(e + "I", 8) + _s(e, "llama")),
        (_s(e, "weird.key"), struct.pack(e + "I", 13) + b"\0" * 8),
    ]
    data, _ = hand_built(3, kvs=kvs, tensors=[])
    p = tmp_path / "u.gguf"
    p.write_bytes(data)
    with pytest.raises(GGUFError, match=r"unknown value type 13 for key 'weird.key'"):
        read_header(str(p))
    kvs[1] = (_s(e, "weird.arr"), struct.pack(e + "I", 9) + struct.pack(e + "IQ", 99, 1) + b"\0" * 8)
    p.write_bytes(hand_built(3, kvs=kvs, tensors=[])[0])
    with pytest.raises(GGUFError, match=r"unknown array element type 99 for key 'weird.arr'"):
        read_header(str(p))


def test_absurd_counts_rejected_before_allocation(tmp_path):
    data, _ = hand_built(3)
    p = tmp_path / "c.gguf"
    # n_tensors = 2**60
    p.write_bytes(data[:8] + struct.pack("<Q", 2**60) + data[16:])
    with pytest.raises(GGUFError, match=r"absurd n_tensors=1152921504606846976"):
        read_header(str(p))
    p.write_bytes(data[:16] + struct.pack("<Q", 10**9) + data[24:])
    with pytest.raises(GGUFError, match=r"absurd n_kv=1000000000"):
        read_header(str(p))
    # array count 2**61 of strings (under max_array only if it were raised)
    e = "<"
    kvs = [
        (_s(e, "general.architecture"), struct.pack(e + "I", 8) + _s(e, "llama")),
        (_s(e, "big.arr"), struct.pack(e + "I", 9) + struct.pack(e + "IQ", 8, 5_000_000) + _s(e, "x")),
    ]
    p.write_bytes(hand_built(3, kvs=kvs, tensors=[])[0])
    with pytest.raises(GGUFError, match=r"absurd array count of 'big.arr'=5000000"):
        read_header(str(p))
    # a string length far beyond the file
    kvs[1] = (_s(e, "big.str"), struct.pack(e + "I", 8) + struct.pack(e + "Q", 10**6) + b"abc")
    p.write_bytes(hand_built(3, kvs=kvs, tensors=[])[0])
    with pytest.raises(GGUFError, match=r"truncated file: string in 'big.str'"):
        read_header(str(p))


def test_invalid_utf8(tmp_path):
    e = "<"
    kvs = [
        (_s(e, "general.architecture"), struct.pack(e + "I", 8) + _s(e, "llama")),
        (_s(e, "general.name"), struct.pack(e + "I", 8) + _s(e, b"bad \xff\xfe name")),
    ]
    p = tmp_path / "u.gguf"
    p.write_bytes(hand_built(3, kvs=kvs, tensors=[])[0])
    h = read_header(str(p))
    assert h.metadata["general.name"] == "bad \ufffd\ufffd name"
    assert len(h.warnings) == 1 and "invalid UTF-8" in h.warnings[0] and "general.name" in h.warnings[0]
    kvs[1] = (_s(e, b"gen\xff.key"), struct.pack(e + "I", 4) + struct.pack(e + "I", 1))
    p.write_bytes(hand_built(3, kvs=kvs, tensors=[])[0])
    with pytest.raises(GGUFError, match=r"key #1 at offset \d+ is not valid UTF-8"):
        read_header(str(p))


def test_bad_alignment_and_duplicates(tmp_path):
    e = "<"
    arch = (_s(e, "general.architecture"), struct.pack(e + "I", 8) + _s(e, "llama"))
    p = tmp_path / "a.gguf"
    p.write_bytes(hand_built(3, kvs=[arch, (_s(e, "general.alignment"), struct.pack(e + "II", 4, 48))], tensors=[])[0])
    with pytest.raises(GGUFError, match="general.alignment must be a positive power of two, got 48"):
        read_header(str(p))
    p.write_bytes(hand_built(3, kvs=[arch, arch], tensors=[])[0])
    with pytest.raises(GGUFError, match="duplicate key 'general.architecture'"):
        read_header(str(p))


# ---------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------


def test_http_range_reads(tmp_path, range_server):
    server, files = range_server
    path = write_gguf(tmp_path / "m.gguf", extra=add_all_types)
    files.files["/repo/m.gguf"] = path.read_bytes()
    url = server.url_for("/repo/m.gguf")
    h = read_header(url)
    local = read_header(str(path))
    assert h.metadata == local.metadata and h.tensors == local.tensors
    assert h.data_offset == local.data_offset
    assert h.file_size == path.stat().st_size  # from Content-Range, no HEAD
    assert h.requests == 1 == len(files.requests)
    assert all(m == "GET" and r and r.startswith("bytes=") for m, _, r in files.requests)
    assert h.bytes_read == files.bytes_sent == path.stat().st_size  # small file: one chunk is all of it


def test_http_qwen_sized_tokenizer(tmp_path, range_server):
    """151,936 string tokens + 151,387 merges, ~6 MB header, like Qwen2/2.5/3."""
    server, files = range_server
    big = {"token_embd.weight": np.zeros((256, 1024), dtype=np.float32)}
    path = write_gguf(tmp_path / "qwen.gguf", arch="qwen2", extra=vocab_writer_extra(151_936, 151_387), tensors=big)
    files.files["/qwen.gguf"] = path.read_bytes()
    first = 1 << 20
    h = read_header(server.url_for("/qwen.gguf"), first_chunk=first)
    assert h.architecture == "qwen2"
    assert h.metadata["tokenizer.ggml.tokens"] == ArraySummary(int(VT.STRING), 151_936)
    assert h.metadata["tokenizer.ggml.merges"] == ArraySummary(int(VT.STRING), 151_387)
    assert h.metadata["tokenizer.ggml.token_type"] == ArraySummary(int(VT.INT32), 151_936)
    assert h.metadata["tokenizer.ggml.eos_token_id"] == 151_935
    assert h.metadata["tokenizer.chat_template"].startswith("{% for m in messages %}")
    assert h.arch_key("attention.head_count_kv") == [2, 2, 4, 4]
    assert h.header_bytes == data_offset_from_size(path, big) > 4_000_000
    assert h.bytes_read == files.bytes_sent <= h.header_bytes + first
    baseline = math.ceil((h.header_bytes + 500_000) / 2_000_000)
    assert h.requests == len(files.requests) <= min(3, baseline)
    assert h.file_size == path.stat().st_size


def test_http_follows_redirects_keeping_range(tmp_path, range_server):
    server, files = range_server
    path = write_gguf(tmp_path / "m.gguf")
    files.files["/cdn/m.gguf"] = path.read_bytes()
    server.expect_request("/resolve/main/m.gguf").respond_with_response(
        Response(status=302, headers={"Location": server.url_for("/cdn/m.gguf")})
    )
    server.handlers.reverse()  # the redirect before the catch-all handler
    h = read_header(server.url_for("/resolve/main/m.gguf"))
    assert h.file_size == path.stat().st_size and h.architecture == "llama"
    assert files.requests == [("GET", "/cdn/m.gguf", f"bytes=0-{(1 << 20) - 1}")]


def test_http_server_ignoring_range(httpserver: HTTPServer):
    produced = {"chunks": 0}

    def huge():
        yield b"GGUF" + b"\3\0\0\0" + b"\0" * (65536 - 8)
        for _ in range(8192):  # 512 MiB if anyone read it all
            produced["chunks"] += 1
            yield b"\0" * 65536

    httpserver.expect_request("/m.gguf").respond_with_response(
        Response(huge(), status=200, headers={"Content-Length": str(8193 * 65536)}, direct_passthrough=True)
    )
    t0 = time.monotonic()
    with pytest.raises(GGUFError, match=r"server does not honour Range requests .*/m.gguf"):
        read_header(httpserver.url_for("/m.gguf"), timeout=5)
    assert time.monotonic() - t0 < 3
    assert produced["chunks"] < 1000  # the body was not drained


@pytest.mark.parametrize("status", [403, 404, 500, 503])
def test_http_error_status(httpserver: HTTPServer, status):
    httpserver.expect_request("/x-model.gguf").respond_with_data("no", status=status)
    url = httpserver.url_for("/x-model.gguf")
    with pytest.raises(GGUFError) as ei:
        read_header(url)
    assert f"HTTP {status}" in str(ei.value) and url in str(ei.value)


def test_http_missing_content_range(httpserver: HTTPServer):
    httpserver.expect_request("/m.gguf").respond_with_data(b"GGUF\3\0\0\0", status=206)
    with pytest.raises(GGUFError, match="Content-Range"):
        read_header(httpserver.url_for("/m.gguf"))


def test_http_empty_file(range_server):
    server, files = range_server
    files.files["/e.gguf"] = b""
    with pytest.raises(GGUFError, match="416"):
        read_header(server.url_for("/e.gguf"))


def test_http_slow_server_times_out(threaded_server: HTTPServer):
    def slow(request):
        time.sleep(3)
        return Response(b"GGUF", status=206, headers={"Content-Range": "bytes 0-3/4"})

    threaded_server.expect_request("/slow.gguf").respond_with_handler(slow)
    t0 = time.monotonic()
    with pytest.raises(GGUFError, match=r"timed out after 0.5s reading .*/slow.gguf"):
        read_header(threaded_server.url_for("/slow.gguf"), timeout=0.5)
    assert time.monotonic() - t0 < 1.5


def test_http_dribbling_server_hits_overall_deadline(threaded_server: HTTPServer, tmp_path):
    data = write_gguf(tmp_path / "m.gguf", extra=vocab_writer_extra(2000, 0)).read_bytes()

    def dribble(request):
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", request.headers["Range"])
        a, b = int(m.group(1)), min(int(m.group(2)), len(data) - 1)

        def gen():
            for i in range(a, b + 1, 64):
                time.sleep(0.05)  # each read is well inside the per-read timeout
                yield data[i : min(i + 64, b + 1)]

        return Response(
            gen(),
            status=206,
            headers={"Content-Range": f"bytes {a}-{b}/{len(data)}", "Content-Length": str(b - a + 1)},
            direct_passthrough=True,
        )

    threaded_server.expect_request("/d.gguf").respond_with_handler(dribble)
    t0 = time.monotonic()
    with pytest.raises(GGUFError, match=r"overall deadline of 1.5s"):
        read_header(threaded_server.url_for("/d.gguf"), timeout=1.0, total_timeout=1.5)
    assert time.monotonic() - t0 < 2.6


def test_http_dead_server_and_refused():
    # listening socket that never accepts/answers: connect succeeds, no response
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    port = s.getsockname()[1]
    try:
        t0 = time.monotonic()
        with pytest.raises(GGUFError, match=rf"timed out after 0.5s reading http://127.0.0.1:{port}/m.gguf"):
            read_header(f"http://127.0.0.1:{port}/m.gguf", timeout=0.5)
        assert time.monotonic() - t0 < 1.5
    finally:
        s.close()
    # nothing listens there any more
    t0 = time.monotonic()
    with pytest.raises(GGUFError, match=rf"127.0.0.1:{port}"):
        read_header(f"http://127.0.0.1:{port}/m.gguf", timeout=0.5)
    assert time.monotonic() - t0 < 1.5


# ---------------------------------------------------------------------------
# split files
# ---------------------------------------------------------------------------


def write_split(tmp_path: Path, n: int = 3, *, count_in_meta: int | None = None) -> list[Path]:
    paths = []
    for k in range(n):
        p = tmp_path / f"model-{k + 1:05d}-of-{n:05d}.gguf"
        w = gguf.GGUFWriter(str(p), "llama")
        w.add_uint16("split.no", k)
        w.add_uint16("split.count", count_in_meta or n)
        w.add_int32("split.tensors.count", n)
        if k == 0:
            w.add_context_length(8192)
            w.add_block_count(n)
        w.add_tensor(f"blk.{k}.w", np.ones((k + 1) * 1000, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        paths.append(p)
    return paths


def test_split_local(tmp_path):
    paths = write_split(tmp_path)
    total = sum(p.stat().st_size for p in paths)
    for p in paths:  # any shard's name gives the model (shard 1) and the total size
        h = read_header(str(p))
        assert h.metadata["split.count"] == 3 and h.metadata["split.no"] == 0
        assert h.arch_key("context_length") == 8192
        assert h.file_size == total
        assert h.shard_sizes == [q.stat().st_size for q in paths]
        assert [t.name for t in h.tensors] == ["blk.0.w"]
    paths[2].unlink()
    with pytest.raises(GGUFError, match=r"cannot open .*model-00003-of-00003.gguf"):
        read_header(str(paths[0]))


def test_split_count_mismatch(tmp_path):
    paths = write_split(tmp_path, 2, count_in_meta=4)
    with pytest.raises(GGUFError, match=r"split.count=4 .* says 2 shards"):
        read_header(str(paths[0]))


def test_split_not_named_like_a_split(tmp_path):
    paths = write_split(tmp_path, 2)
    other = tmp_path / "renamed.gguf"
    other.write_bytes(paths[0].read_bytes())
    with pytest.raises(GGUFError, match=r"split.count.*-0000k-of-0000n"):
        read_header(str(other))


def test_split_http(tmp_path, range_server):
    server, files = range_server
    paths = write_split(tmp_path, 3)
    for p in paths:
        files.files[f"/r/{p.name}"] = p.read_bytes()
    h = read_header(server.url_for(f"/r/{paths[1].name}") + "?download=true")
    assert h.file_size == sum(p.stat().st_size for p in paths)
    assert h.arch_key("context_length") == 8192
    assert h.requests == 3 == len(files.requests)  # one header read + one 1-byte probe per other shard
    assert [path for _, path, _ in files.requests] == [f"/r/{p.name}" for p in paths]
    assert [r for _, _, r in files.requests][1:] == ["bytes=0-0", "bytes=0-0"]
    del files.files[f"/r/{paths[2].name}"]
    with pytest.raises(GGUFError, match=r"HTTP 404 .*model-00003-of-00003.gguf"):
        read_header(server.url_for(f"/r/{paths[0].name}"))


# ---------------------------------------------------------------------------
# fuzzing: mutated headers only ever raise GGUFError, quickly
# ---------------------------------------------------------------------------

_SMALL: bytes | None = None


def small_valid_gguf(tmp_dir: Path) -> bytes:
    global _SMALL
    if _SMALL is None:
        _SMALL = write_gguf(
            tmp_dir / "small.gguf",
            extra=add_all_types,
            tensors={"a.weight": np.ones((2, 3), dtype=np.float32), "b": np.ones(4, dtype=np.float16)},
        ).read_bytes()
    return _SMALL


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.integers(1, 16)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("big"), st.integers(0, 10**6), st.sampled_from([0xFF, 0x7F, 0x80])),
)


@settings(
    max_examples=int(os.environ.get("GGUF_FUZZ_EXAMPLES", "300")),
    deadline=1000,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(muts=st.lists(mutation, min_size=1, max_size=4))
def test_fuzz_mutated_headers(tmp_path_factory, muts):
    tmp = tmp_path_factory.getbasetemp()
    data = bytearray(small_valid_gguf(tmp))
    header = len(data) - 64
    for kind, pos, arg in muts:
        span = max(min(header, len(data)), 1)  # mutate mostly in the header
        if kind == "flip" and data:
            data[pos % span] ^= arg or 1
        elif kind == "insert":
            data[pos % span : pos % span] = arg
        elif kind == "delete":
            del data[pos % span : pos % span + arg]
        elif kind == "truncate":
            del data[pos % span :]
        elif kind == "big" and data:  # make a count/length huge
            data[pos % span : pos % span + 8] = bytes([arg]) * 8
    p = tmp / f"fuzz-{threading.get_ident()}.gguf"
    p.write_bytes(bytes(data))
    try:
        h = read_header(str(p), first_chunk=256)
    except GGUFError as exc:
        assert str(exc)
    else:
        assert isinstance(h.metadata, dict) and h.header_bytes == h.data_offset
