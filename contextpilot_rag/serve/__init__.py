"""``contextpilot-rag serve``: an OpenAI-compatible proxy (starlette + uvicorn) in front
of a fleet of OpenAI-compatible engines, for clients in any language.

Requests are routed over the fleet by a
:class:`~contextpilot_rag.routing.client.RoutingClient`. A request that carries its
documents in the ``contextpilot`` field (``extra_body={"contextpilot": {...}}`` in the
OpenAI SDKs) is first built into a prompt by a :class:`~contextpilot_rag.ContextPilot`:
reordered for prefix-cache reuse, de-duplicated against its conversation, annotated;
its answer becomes the conversation's history. A request without the field is routed
with its messages as sent. The contract (request field, ``contextpilot`` response
object, errors) is in :mod:`.request_body`, :mod:`.responses` and docs/serve.md::

    from contextpilot_rag.serve import BackgroundServer, ServeConfig

    config = ServeConfig(endpoints=("http://10.0.0.1:8000/v1",), model="qwen2.5-7b")
    with BackgroundServer(config) as server:        # or: contextpilot-rag serve ...
        client = openai.OpenAI(base_url=server.base_url, api_key="-")

Needs the ``serve`` extra (``pip install "contextpilot-rag[serve]"``): starlette and
uvicorn are imported only when an app is built, with a :class:`ConfigError` naming the
extra when they are missing.
"""

from __future__ import annotations

from .config import API_KEY_ENV, ServeConfig
from .server import BackgroundServer, build_app, serve

__all__ = ["API_KEY_ENV", "BackgroundServer", "ServeConfig", "build_app", "serve"]
