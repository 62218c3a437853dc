"""A small, real HTTP/1.1 server that speaks the part of OpenAI's protocol an engine serves
(`/v1/chat/completions`, `/v1/completions`, SSE when `stream: true`, `/health`), in a thread
of its own. Used by the router's tests and by bench/bench_router.py when no llama-server is at
hand. What it does on the next requests is set by the test: answer, fail with 500, drop the
connection, or stream chunks held back by a gate the test opens.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time


class FakeEngine:
    def __init__(self, name: str = "engine", tokens: int = 3):
        self.name = name
        self.tokens = tokens  # how many content chunks a stream sends
        self.mode = "ok"  # ok | error500 | drop | drop-once (the next request only)
        self.received: list[dict] = []  # bodies of the completion requests, in order
        self.gate: threading.Event | None = None  # when set: a stream waits for it after its first chunk
        self.chunk_delay = 0.0
        self.finished = threading.Event()  # set when a stream's last byte has been written
        self.disconnected = threading.Event()  # set when a client left in the middle of a stream
        self.active = 0  # requests being answered now
        self.peak_active = 0
        self._loop = None
        self._server = None
        self._thread = None
        self.port = None

    # -- lifecycle --
    def start(self) -> "FakeEngine":
        ready = threading.Event()

        def run():
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0, backlog=512))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True, name=f"fake-{self.name}")
        self._thread.start()
        ready.wait(5)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return

        async def close():
            self._server.close()
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- protocol --
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                keep = await self._answer(method, path, body, writer)
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _answer(self, method, path, body, writer) -> bool:
        if path == "/health":
            return await self._json(writer, 200, {"status": "ok"})
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            return await self._json(writer, 404, {"error": {"message": "not found"}})
        request = json.loads(body)
        self.received.append(request)
        if self.mode == "drop":
            return False  # close without a word
        if self.mode == "drop-once":
            self.mode = "ok"
            return False
        if self.mode == "error500":
            return await self._json(writer, 500, {"error": {"message": f"{self.name} is broken", "type": "server_error"}})
        self.active += 1
        self.peak_active = max(self.peak_active, self.active)
        try:
            chat = path.endswith("chat/completions")
            if request.get("stream"):
                return await self._stream(writer, request, chat)
            text = f"hello from {self.name}"
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            else:
                choice = {"index": 0, "text": text, "finish_reason": "stop"}
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
            return await self._json(writer, 200, {
                "id": "cmpl-1", "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": request.get("model"), "choices": [choice],
                "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
                "engine": self.name,
            })
        finally:
            self.active -= 1

    async def _json(self, writer, status, payload) -> bool:
        data = json.dumps(payload).encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n".encode() + data
        )
        await writer.drain()
        return True

    async def _stream(self, writer, request, chat) -> bool:
        self.finished.clear()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")

        async def event(payload):
            data = b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n"
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()

        try:
            for i in range(self.tokens):
                delta = {"content": f"t{i} "} if chat else None
                choice = {"index": 0, "delta": delta, "finish_reason": None} if chat else {"index": 0, "text": f"t{i} ", "finish_reason": None}
                await event({"id": "cmpl-1", "object": "chat.completion.chunk" if chat else "text_completion",
                             "model": request.get("model"), "choices": [choice], "engine": self.name})
                if i == 0 and self.gate is not None:
                    while not self.gate.is_set():
                        await asyncio.sleep(0.01)
                if self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
            await event(b"[DONE]")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            self.finished.set()
            return True
        except (ConnectionError, OSError):
            self.disconnected.set()
            return False
