"""One HTTP client per process for talking to engines (creating one loads the CA bundle:
about 0.1 s, too slow to do per probe). Plain HTTP, short timeouts, no proxies."""

from __future__ import annotations

import os
import threading

import httpx

_lock = threading.Lock()
_client: httpx.Client | None = None
_pid = 0


def client() -> httpx.Client:
    global _client, _pid
    if _client is None or _pid != os.getpid():  # a forked worker child gets its own
        with _lock:
            if _client is None or _pid != os.getpid():
                _client = httpx.Client(timeout=httpx.Timeout(5.0, connect=1.0), trust_env=False,
                                       limits=httpx.Limits(max_connections=64, max_keepalive_connections=16))
                _pid = os.getpid()
    return _client
