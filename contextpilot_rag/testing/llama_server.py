"""Real ``llama-server`` (llama.cpp) processes on loopback, for engine tests and benchmarks.

The engine is not a dependency: ``contextpilot-rag engine install --engine llama-server
--model gemma3`` (or ``benchmarks/engines/build_llama_server.sh``, which runs it) builds it
and fetches a small GGUF model into the engine home (docs/engines.md), and
:func:`find_llama_server` finds them there, in a checkout's ``.engines/`` (the older
layout), or through ``CONTEXTPILOT_LLAMA_SERVER`` and ``CONTEXTPILOT_GGUF``. Tests skip
when it returns ``None``::

    engine = find_llama_server()
    with LlamaServer(engine, slots=2) as server:
        RoutingClient([server.base_url], model=server.model_name).complete("Hello")
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..engines.home import EngineLayout
from ..errors import ConfigError

__all__ = ["LlamaEngine", "LlamaServer", "find_llama_server"]

_MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"


@dataclass(frozen=True)
class LlamaEngine:
    """A ``llama-server`` binary and the GGUF model it serves."""

    binary: Path
    model: Path


def find_llama_server(root: Path | None = None) -> LlamaEngine | None:
    """The engine from ``CONTEXTPILOT_LLAMA_SERVER`` / ``CONTEXTPILOT_GGUF`` (each
    overrides its part), else from ``ROOT/.engines/`` (``root``: the current directory),
    else from the engine home; ``None`` if no place has both parts."""
    base = (root or Path.cwd()) / ".engines"
    home = EngineLayout.default()
    places = [
        (base / "bin" / "llama-server", base / _MODEL_FILE),
        (home.llama_server, home.models_dir / _MODEL_FILE),
    ]
    for default_binary, default_model in places:
        binary = Path(os.environ.get("CONTEXTPILOT_LLAMA_SERVER") or default_binary)
        model = Path(os.environ.get("CONTEXTPILOT_GGUF") or default_model)
        if binary.is_file() and os.access(binary, os.X_OK) and model.is_file():
            return LlamaEngine(binary, model)
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LlamaServer:
    """One ``llama-server`` process on ``127.0.0.1``: ``slots`` parallel slots (each
    keeps the prefix of its last prompt), ``context_tokens`` in all, ``threads`` CPU
    threads, ``--swa-full`` (full prefix reuse for sliding-window models such as
    Gemma 3). ``base_url`` is its OpenAI-compatible ``/v1`` root. Stopped on exit."""

    model_name = "gemma-3-270m"

    def __init__(
        self,
        engine: LlamaEngine,
        *,
        slots: int = 1,
        context_tokens: int = 16_384,
        threads: int = 1,
        extra_args: tuple[str, ...] = (),
        startup_timeout_s: float = 120.0,
    ) -> None:
        if slots < 1 or threads < 1 or context_tokens < 512:
            raise ConfigError("LlamaServer needs slots >= 1, threads >= 1, context_tokens >= 512")
        self.engine = engine
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.args = [
            str(engine.binary),
            *("-m", str(engine.model), "-c", str(context_tokens), "-np", str(slots)),
            *("-t", str(threads), "--swa-full", "--host", "127.0.0.1"),
            *("--port", str(self.port), "--alias", self.model_name),
            *extra_args,
        ]
        self.startup_timeout_s = startup_timeout_s
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> LlamaServer:
        """Start the process and wait until ``/health`` answers 200."""
        self._process = subprocess.Popen(
            self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + self.startup_timeout_s
        health = self.base_url.removesuffix("/v1") + "/health"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self._process.returncode}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(health, timeout=2.0).status_code == 200:
                    return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama-server did not become healthy in {self.startup_timeout_s} s")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
