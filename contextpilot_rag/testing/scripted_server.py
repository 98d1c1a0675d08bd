"""A loopback chat endpoint that streams a fixed script of deltas, for tests of the
clients built on the streaming protocol (tool-call fragments the way engines split
them, finish reasons); unlike :class:`~.openai_server.OpenAICompatibleServer` it
models no engine."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ScriptedChatServer"]


class ScriptedChatServer:
    """Answers every ``POST`` with the same SSE stream: one chunk per delta of
    ``deltas``, a last chunk with ``finish_reason``, then ``[DONE]``. ``requests``
    holds the JSON bodies received. Use as a context manager; ``base_url`` is
    ``http://127.0.0.1:<port>/v1``."""

    def __init__(self, deltas: Sequence[Mapping[str, Any]], *, finish_reason: str = "stop"):
        chunks = [{"choices": [{"index": 0, "delta": dict(d)}]} for d in deltas]
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}]})
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        self._body = body.encode()
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
                script.requests.append(json.loads(raw or b"{}"))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(script._body)))
                self.end_headers()
                self.wfile.write(script._body)

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
