"""Engines that serve requests: one started here (:class:`RunningEngine`) or any
OpenAI-compatible server somewhere else (:class:`ExternalEngine`), behind one protocol.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

import httpx

from ..errors import ConfigError
from .processes import group_members, terminate_group

__all__ = ["ExternalEngine", "KVEventPorts", "RunningEngine", "ServingEngine", "external_engine"]


@runtime_checkable
class ServingEngine(Protocol):
    """What a benchmark or an example needs from an engine."""

    @property
    def kind(self) -> str: ...
    @property
    def base_url(self) -> str:
        """The OpenAI-compatible root, ending in ``/v1``."""
        ...

    @property
    def model_name(self) -> str: ...
    @property
    def block_size(self) -> int | None:
        """Granularity of prefix reuse in tokens (``None``: unknown)."""
        ...

    @property
    def kv_cache_tokens(self) -> int | None:
        """How many tokens the prefix cache holds (``None``: unknown)."""
        ...

    @property
    def flags(self) -> tuple[str, ...]:
        """The engine's command-line flags, for reports."""
        ...

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache; ``False`` when the engine cannot."""
        ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class KVEventPorts:
    """Loopback ports for vLLM's KV-cache events (``--kv-events-config``).

    vLLM *binds* only wildcard (``tcp://*``: every interface) or ipc endpoints and
    *connects* to the rest, so to stay on loopback the engine connects its PUB socket to
    ``tcp://127.0.0.1:publisher`` — **the subscriber binds there** — and binds its replay
    ROUTER on ``tcp://127.0.0.1:replay``, where a DEALER connects.
    """

    publisher: int
    replay: int | None = None
    topic: str = "kv"

    def __post_init__(self) -> None:
        for port in (self.publisher, self.replay):
            if port is not None and not (isinstance(port, int) and 0 < port < 65536):
                raise ConfigError(f"KV event port {port!r} is not in 1..65535")
        if self.replay == self.publisher:
            raise ConfigError("the KV event publisher and replay ports must differ")

    @property
    def publisher_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.publisher}"

    @property
    def replay_endpoint(self) -> str | None:
        return None if self.replay is None else f"tcp://127.0.0.1:{self.replay}"


def _loopback_client() -> httpx.Client:
    # trust_env=False: a proxy from the environment must never see loopback traffic
    return httpx.Client(timeout=5.0, trust_env=False)


class RunningEngine:
    """An engine process started by this package on ``127.0.0.1``.

    The process runs under the watchdog (``_watchdog.py``), which leads the engine's
    process group: ``pid`` is the watchdog's pid and the group's id. :meth:`stop`
    terminates the whole group, so processes the engine spawned die with it.
    """

    def __init__(
        self,
        *,
        kind: str,
        model_name: str,
        port: int,
        process: subprocess.Popen[bytes],
        command: tuple[str, ...],
        log_path: Path,
        log_offset: int,
        block_size: int | None,
        stop_grace_s: float,
        kv_events: KVEventPorts | None = None,
        on_release: Callable[[RunningEngine], None] | None = None,
        relaunch: Callable[[RunningEngine], None] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self.env = dict(env or {})  # what the project added to the engine's environment
        self.model_name = model_name
        self.port = port
        self.command = command
        self.log_path = log_path
        self.log_offset = log_offset  # where this run's output starts in the log
        self.block_size = block_size
        self.kv_events = kv_events
        self.kv_cache_tokens: int | None = None  # set once the engine is ready
        self._process = process
        self._stop_grace_s = stop_grace_s
        self._on_release = on_release
        self._relaunch = relaunch
        self._stopped = False

    @property
    def pid(self) -> int:
        """The watchdog's pid, which is also the engine's process-group id."""
        return self._process.pid

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    @property
    def flags(self) -> tuple[str, ...]:
        return self.command[1:]

    def pids(self) -> list[int]:
        """Live processes of the engine's group (watchdog, engine, its children)."""
        return [] if self._stopped else group_members(self.pid)

    def exited(self) -> bool:
        return self._process.poll() is not None

    def healthy(self) -> bool:
        """Whether ``/health`` answers 200 now."""
        with contextlib.suppress(httpx.HTTPError), _loopback_client() as client:
            return client.get(f"{self.root_url}/health", timeout=2.0).status_code == 200
        return False

    def reset_prefix_cache(self) -> bool:
        """vLLM: ``POST /reset_prefix_cache`` (the server runs with
        ``VLLM_SERVER_DEV_MODE=1``). llama-server has no global reset (its slots and
        its host-memory prompt cache keep earlier prompts): it is restarted
        (:meth:`restart`, about a second for the small models). ``False`` when the
        engine cannot be reset."""
        if self.kind == "vllm":
            with _loopback_client() as client:
                return client.post(f"{self.root_url}/reset_prefix_cache").status_code == 200
        if self.kind == "llama-server" and self._relaunch is not None:
            self.restart()
            return True
        return False

    def restart(self) -> None:
        """Stop the engine and start the same command on the same port: a cold engine
        (every cache empty) behind the same URL, stopped at exit like the first.
        Raises :class:`ConfigError` for an engine that cannot be started again and
        :class:`~.errors.EngineStartError` when it does not come back."""
        if self._relaunch is None:
            raise ConfigError(f"{self!r} was not started with a command to start again")
        self.stop()
        self._relaunch(self)

    def _replace_process(self, process: subprocess.Popen[bytes], log_offset: int) -> None:
        """Adopt the process a restart started (called by the launcher only)."""
        self._process = process
        self.log_offset = log_offset
        self._stopped = False

    def detach(self) -> None:
        """Let the engine outlive this process: the watchdog stops watching it and
        :meth:`stop` is no longer called at exit."""
        os.kill(self.pid, signal.SIGUSR1)
        self._release()

    def stop(self) -> None:
        """Terminate the engine's whole process group and wait until it is gone
        (SIGTERM, then SIGKILL after the grace period). Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._release()
        leader_alive = self._process.poll() is None  # unreaped: its pid cannot be reused
        terminate_group(self.pid, leader_alive=leader_alive, grace_s=self._stop_grace_s + 5.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=5.0)

    def _release(self) -> None:
        if self._on_release is not None:
            self._on_release(self)

    def __enter__(self) -> RunningEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"RunningEngine({self.kind}, {self.model_name!r}, {self.base_url}, pid={self.pid})"


@dataclass(frozen=True)
class ExternalEngine:
    """An OpenAI-compatible server this package did not start: it is neither stopped
    nor reset here."""

    base_url: str
    model_name: str
    kind: str = "external"
    block_size: int | None = None
    kv_cache_tokens: int | None = None
    flags: tuple[str, ...] = ()

    def reset_prefix_cache(self) -> bool:
        return False

    def stop(self) -> None:
        return None

    def __enter__(self) -> ExternalEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def external_engine(endpoint: str, model: str) -> ExternalEngine:
    """An engine at ``endpoint`` (``http(s)://host:port`` with or without ``/v1``)
    serving ``model``."""
    if not isinstance(endpoint, str) or not isinstance(model, str) or not model.strip():
        raise ConfigError("external_engine needs an endpoint URL and a model name (strings)")
    parts = urlsplit(endpoint.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"endpoint {endpoint!r} is not an http(s) URL")
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return ExternalEngine(f"{parts.scheme}://{parts.netloc}{path}", model.strip())
