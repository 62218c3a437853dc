"""Benchmark: bytes and requests to read a GGUF header over HTTP Range requests.

Run:  .venv/bin/python bench/bench_gguf_http.py

Serves GGUF files made with gguf.GGUFWriter whose headers are about 0.7, 6, 8
and 16 MB (tokenizers shaped like Llama-2 SPM 32k, Qwen 152k + merges, Llama-3
128k + 280k merges, Gemma 262k + 515k merges; tensor data is tiny) from a local
threaded stdlib HTTP server that honours Range and counts bytes and requests.
For each it reads the header with catalog.domain.gguf.read_header and with a
baseline reader doing what huggingface.js (@huggingface/gguf) does: sequential
2,000,000-byte Range chunks, fetching the next chunk before an entry when fewer
than 500,000 bytes remain beyond the parse position, and on overflow of a value.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
import struct
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gguf
import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from catalog.domain.gguf import read_header  # noqa: E402

logging.getLogger("gguf").setLevel(logging.WARNING)

FIRST_CHUNK = 1 << 20
HF_CHUNK = 2_000_000
HF_LEEWAY = 500_000


# ---------------------------------------------------------------------------
# test files
# ---------------------------------------------------------------------------


def bpe_like_strings(rnd: random.Random, n: int, lo: float, hi: float) -> list[str]:
    """Strings whose length grows with the index, like a BPE vocabulary ordered by merge rank."""
    alphabet = "abcdefghijklmnopqrstuvwxyzĠ etaoinshrdlu0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ.,"
    out = []
    for i in range(n):
        mean = lo + (hi - lo) * i / max(n - 1, 1)
        k = max(1, int(rnd.gauss(mean, mean / 3)))
        out.append("".join(rnd.choices(alphabet, k=k)))
    return out


def make_model(path: Path, name: str, arch: str, n_tokens: int, n_merges: int, spm: bool, seed: int) -> None:
    rnd = random.Random(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(8192)
    w.add_embedding_length(4096)
    w.add_block_count(32)
    w.add_head_count(32)
    w.add_head_count_kv(8)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(15)
    w.add_tokenizer_model("llama" if spm else "gpt2")
    w.add_tokenizer_pre("default" if spm else name.lower())
    w.add_token_list(bpe_like_strings(rnd, n_tokens, 3.0, 10.0))
    if spm:
        w.add_token_scores([float(-i) for i in range(n_tokens)])
    w.add_token_types([1] * n_tokens)
    if n_merges:
        a = bpe_like_strings(rnd, n_merges, 3.0, 9.0)
        b = bpe_like_strings(rnd, n_merges, 3.0, 9.0)
        w.add_token_merges([f"{x} {y}" for x, y in zip(a, b)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}" * 20)
    w.add_quantization_version(2)
    for blk in range(32):  # 9 tensor infos per block, like a Llama; tiny data
        for t in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{blk}.{t}.weight", np.zeros(8, dtype=np.float32))
    w.add_tensor("token_embd.weight", np.zeros(1 << 20, dtype=np.float32))  # 4 MiB > first chunk
    w.add_tensor("output.weight", np.zeros(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


MODELS = [
    # name, arch, tokens, merges, spm
    ("Llama-2", "llama", 32_000, 0, True),
    ("Qwen2", "qwen2", 151_936, 151_387, False),
    ("Llama-3", "llama", 128_256, 280_147, False),
    ("Gemma-4", "gemma3", 262_144, 514_906, False),
]


# ---------------------------------------------------------------------------
# server
# ---------------------------------------------------------------------------


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.bytes = 0

    def reset(self) -> None:
        with self.lock:
            self.requests = self.bytes = 0


FILES: dict[str, bytes] = {}
STATS = Stats()


class RangeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        data = FILES.get(self.path.split("?")[0])
        with STATS.lock:
            STATS.requests += 1
        if data is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if not m:
            a, b, status = 0, len(data) - 1, 200
        else:
            a = int(m.group(1))
            b = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
            status = 206
        body = data[a : b + 1]
        self.send_response(status)
        if status == 206:
            self.send_header("Content-Range", f"bytes {a}-{b}/{len(data)}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass
        with STATS.lock:
            STATS.bytes += len(body)


# ---------------------------------------------------------------------------
# baseline: huggingface.js-style reader over the same server
# ---------------------------------------------------------------------------


class _Underflow(Exception):
    pass


def baseline_read(client: httpx.Client, url: str) -> int:
    """Parse the header like @huggingface/gguf; returns the data offset it found."""
    buf = bytearray()
    size = [None]

    def fetch_chunk() -> None:
        k = len(buf) // HF_CHUNK
        start, end = k * HF_CHUNK, (k + 1) * HF_CHUNK - 1
        if size[0] is not None and start >= size[0]:
            raise RuntimeError("EOF")
        r = client.get(url, headers={"Range": f"bytes={start}-{end}"})
        r.raise_for_status()
        size[0] = int(r.headers["content-range"].rsplit("/", 1)[1])
        buf.extend(r.content)

    fetch_chunk()
    pos = [0]

    def take(n: int) -> bytes:
        if pos[0] + n > len(buf):
            raise _Underflow
        out = bytes(buf[pos[0] : pos[0] + n])
        pos[0] += n
        return out

    e = "<"
    u32 = lambda: struct.unpack(e + "I", take(4))[0]  # noqa: E731
    u64 = lambda: struct.unpack(e + "Q", take(8))[0]  # noqa: E731
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def value(t: int) -> None:
        if t in sizes:
            take(sizes[t])
        elif t == 8:
            take(u64())
        elif t == 9:
            et, n = u32(), u64()
            for _ in range(n):
                value(et)
        else:
            raise ValueError(t)

    def entry(fn) -> None:
        # fetch ahead when fewer than LEEWAY bytes remain; on overflow fetch and retry (<= 30 times)
        if len(buf) - pos[0] < HF_LEEWAY and len(buf) < (size[0] or 0):
            fetch_chunk()
        start = pos[0]
        for _ in range(30):
            try:
                fn()
                return
            except _Underflow:
                pos[0] = start
                fetch_chunk()
        raise RuntimeError("too many fetches")

    take(4)
    entry(lambda: None)
    version = u32()
    assert version in (2, 3)
    n_tensors, n_kv = u64(), u64()
    for _ in range(n_kv):
        entry(lambda: (take(u64()), value(u32())))
    for _ in range(n_tensors):
        entry(lambda: (take(u64()), [u64() for _ in range(u32())], u32(), u64()))
    return -(-pos[0] // 32) * 32


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-gguf-"))
    t0 = time.monotonic()
    for i, (name, arch, n_tok, n_merge, spm) in enumerate(MODELS):
        p = tmp / f"{name}.gguf"
        make_model(p, name, arch, n_tok, n_merge, spm, seed=i)
        FILES[f"/{name}.gguf"] = p.read_bytes()
        if os.environ.get("BENCH_KEEP"):
            print("kept", p)
        else:
            p.unlink()
    gen_s = time.monotonic() - t0

    server = ThreadingHTTPServer(("127.0.0.1", 0), RangeHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    print(f"generated {len(MODELS)} GGUF files in {gen_s:.1f}s; first_chunk={FIRST_CHUNK} B; "
          f"baseline = huggingface.js ({HF_CHUNK:,} B chunks, {HF_LEEWAY:,} B leeway)")
    hdr = (f"{'model':<9} {'tokens':>7} {'merges':>7} {'header B':>11} | {'ours B':>11} {'req':>3} {'ms':>5} | "
           f"{'base B':>11} {'req':>3} {'formula req':>11} | {'B ratio':>7} {'req ratio':>9} | over-read")
    print(hdr)
    print("-" * len(hdr))
    ok = True
    with httpx.Client() as client:
        for name, _arch, n_tok, n_merge, _spm in MODELS:
            url = f"{base}/{name}.gguf"
            size = len(FILES[f"/{name}.gguf"])
            STATS.reset()
            t = time.monotonic()
            h = read_header(url, first_chunk=FIRST_CHUNK, client=client)
            ours_ms = (time.monotonic() - t) * 1000
            ours_b, ours_r = STATS.bytes, STATS.requests
            assert (ours_b, ours_r) == (h.bytes_read, h.requests), "reader and server disagree"
            STATS.reset()
            off = baseline_read(client, url)  # (its pure-Python parse is slow; only bytes/requests compared)
            base_b, base_r = STATS.bytes, STATS.requests
            assert off == h.data_offset, (off, h.data_offset)
            formula_r = math.ceil((h.header_bytes + HF_LEEWAY) / HF_CHUNK)
            over = ours_b - h.header_bytes
            print(f"{name:<9} {n_tok:>7} {n_merge:>7} {h.header_bytes:>11,} | {ours_b:>11,} {ours_r:>3} {ours_ms:>5.0f} | "
                  f"{base_b:>11,} {base_r:>3} {formula_r:>11} | {ours_b / base_b:>7.2f} "
                  f"{ours_r / base_r:>9.2f} | {over:+,} B")
            if ours_b > h.header_bytes + FIRST_CHUNK:
                ok = False
                print(f"  GOAL MISSED: {name} read {ours_b} > header + first_chunk = {h.header_bytes + FIRST_CHUNK}")
            if ours_r > base_r:
                ok = False
                print(f"  GOAL MISSED: {name} used {ours_r} requests > baseline {base_r}")
            if name == "Llama-3" and ours_r > 3:
                ok = False
                print(f"  GOAL MISSED: Llama-3 (8 MB) used {ours_r} > 3 requests")
            assert size >= h.header_bytes
    server.shutdown()
    print("goals (bytes <= header + first_chunk; requests <= baseline; <= 3 requests for the 8 MB header):",
          "all met" if ok else "MISSED")


if __name__ == "__main__":
    main()
