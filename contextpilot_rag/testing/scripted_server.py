"""A loopback chat endpoint that streams a fixed script of deltas, for tests of the
clients built on the streaming protocol (tool-call fragments the way engines split
them, finish reasons); unlike :class:`~.openai_server.OpenAICompatibleServer` it
models no engine."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ScriptedChatServer"]


class ScriptedChatServer:
    """Answers every ``POST`` with the same SSE stream: one chunk per delta of
    ``deltas``, a last chunk with ``finish_reason``, a usage chunk (``usage``, if
    given), then ``[DONE]``; the first chunk after ``first_chunk_delay_s``. ``requests``
    holds the JSON bodies received. Use as a context manager; ``base_url`` is
    ``http://127.0.0.1:<port>/v1``."""

    def __init__(
        self,
        deltas: Sequence[Mapping[str, Any]],
        *,
        finish_reason: str = "stop",
        usage: Mapping[str, Any] | None = None,
        first_chunk_delay_s: float = 0.0,
    ):
        chunks: list[dict[str, Any]] = [
            {"choices": [{"index": 0, "delta": dict(d)}]} for d in deltas
        ]
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}]})
        if usage is not None:  # as engines send it with stream_options.include_usage
            chunks.append({"choices": [], "usage": dict(usage)})
        self._head, *rest = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks]
        self._tail = b"".join(rest) + b"data: [DONE]\n\n"
        self._delay_s = first_chunk_delay_s  # a prefill's time to first token
        self.requests: list[dict[str, Any]] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the server is not running")
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> ScriptedChatServer:
        script = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:  # as an engine answers a body that is no JSON
                    error = {"message": "request body is not valid JSON"}
                    sent = json.dumps({"error": {**error, "type": "invalid_request_error"}})
                    self.send_response(400)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(sent)))
                    self.end_headers()
                    self.wfile.write(sent.encode())
                    return
                script.requests.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(script._head) + len(script._tail)))
                self.end_headers()
                time.sleep(script._delay_s)
                try:
                    self.wfile.write(script._head)
                    self.wfile.flush()
                    self.wfile.write(script._tail)
                except ConnectionError:  # the client gave up waiting: nothing to report
                    self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
