"""Running the proxy with uvicorn: :func:`serve` (the ``serve`` command: one process,
or ``workers`` processes sharing the port) and :class:`BackgroundServer` (in a thread
of this process, on a free loopback port: tests, examples, notebooks)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..lifecycle import Startable
from .config import ServeConfig

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from .proxy import Proxy

__all__ = [
    "CONFIG_ENV",
    "BackgroundServer",
    "app_from_environment",
    "require_dependencies",
    "serve",
]

logger = logging.getLogger(__name__)

CONFIG_ENV = "CONTEXTPILOT_SERVE_CONFIG"
"""Where :func:`serve` hands the configuration (JSON) to its worker processes."""


def require_dependencies() -> None:
    """Raise :class:`ConfigError` naming the extra to install when starlette or uvicorn
    is missing."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f'contextpilot-rag serve needs {exc.name}: pip install "contextpilot-rag[serve]"'
        ) from None


def build_app(config: ServeConfig, *, proxy: Proxy | None = None) -> Starlette:
    """The ASGI app of ``config`` (see :func:`~.app.create_app`)."""
    require_dependencies()
    from .app import create_app

    return create_app(config, proxy=proxy)


def app_from_environment() -> Starlette:
    """The app of a worker process: its configuration from :data:`CONFIG_ENV`."""
    text = os.environ.get(CONFIG_ENV)
    if not text:
        raise ConfigError(f"{CONFIG_ENV} is not set: start workers with contextpilot-rag serve")
    return build_app(ServeConfig.from_json(text))


def serve(config: ServeConfig) -> None:
    """Serve until interrupted. With ``workers > 1`` each worker process builds its
    own proxy (pilot, routing client, metrics): they share conversations and routes
    only through ``store``."""
    require_dependencies()
    import uvicorn

    _warn_about(config)
    if config.workers == 1:
        uvicorn.run(build_app(config), host=config.host, port=config.port)
        return
    build_app(config).state.proxy.client.close()  # a configuration error shows here, once
    os.environ[CONFIG_ENV] = config.to_json()
    uvicorn.run(
        f"{__name__}:app_from_environment",
        factory=True,
        workers=config.workers,
        host=config.host,
        port=config.port,
    )


def _warn_about(config: ServeConfig) -> None:
    if not config.loopback and config.api_key is None:
        logger.warning(
            "serving on %s without an API key: anyone who reaches it can use the fleet "
            "(set CONTEXTPILOT_API_KEY)",
            config.host,
        )
    if config.workers > 1 and config.store is None:
        logger.warning(
            "%d workers without --store: each keeps its own conversations and routes, so a "
            "conversation continued on another worker loses its history",
            config.workers,
        )


class BackgroundServer(Startable):
    """The proxy served by uvicorn in a daemon thread of this process, on ``host`` and
    a free port (``config.port`` and ``config.workers`` are not used)::

        with BackgroundServer(ServeConfig(endpoints=urls, model="m")) as server:
            openai.OpenAI(base_url=server.base_url, api_key="-")...

    ``proxy`` is the running :class:`~.proxy.Proxy` (its pilot, client, metrics)."""

    def __init__(self, config: ServeConfig, *, startup_timeout_s: float = 30.0) -> None:
        require_dependencies()
        import uvicorn

        self.config = config
        self.app = build_app(config)
        self.proxy: Proxy = self.app.state.proxy
        self._socket = socket.socket(_family(config.host), socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((config.host, 0))
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                log_level="warning",
                lifespan="on",
                access_log=False,
                timeout_graceful_shutdown=5,
            )
        )
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )
        self._startup_timeout_s = startup_timeout_s

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    @property
    def base_url(self) -> str:
        """``http://host:port/v1``, what an OpenAI client takes as ``base_url``."""
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port}/v1"

    def start(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the proxy did not start; see the log")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving (open streams are cut) and close the port. Idempotent."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=10.0)
        self._socket.close()


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
