"""Starting an engine process safely: on loopback, under the watchdog, in its own
process group, with its output in a log file, stopped when this process exits.

:func:`launch_engine` takes any command (the real engines' commands come from
:mod:`.start`), so tests run the same code path with a stand-in server.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .._numbers import is_finite_at_least, is_finite_positive
from ..errors import ConfigError
from .cache_info import kv_cache_tokens_from_log, kv_cache_tokens_from_metrics
from .errors import EngineStartError
from .running import KVEventPorts, RunningEngine

__all__ = [
    "LaunchSpec",
    "check_loopback",
    "free_port",
    "launch_engine",
    "log_tail",
    "normalise_extra_args",
    "stop_all_engines",
]

_WATCHDOG = Path(__file__).with_name("_watchdog.py")
_FORBIDDEN_FLAGS = ("--host", "--port")
_PORT_RELEASE_S = 10.0  # how long a restart waits for the stopped engine's port


def check_loopback(host: str) -> str:
    """``"127.0.0.1"`` for ``host`` ``"127.0.0.1"`` or ``"localhost"``; any other host is
    a :class:`ConfigError`: engines started here never listen beyond loopback."""
    if host not in ("127.0.0.1", "localhost"):
        raise ConfigError(f"engines listen on loopback only (127.0.0.1), not {host!r}")
    return "127.0.0.1"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _port_is_free(port: int, *, reuse: bool = False) -> bool:
    """Whether ``port`` on loopback can be bound; ``reuse``: as a server with
    ``SO_REUSEADDR`` binds it (connections of a stopped server in TIME_WAIT do not
    count, a listener does)."""
    with socket.socket() as probe:
        if reuse:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class LaunchSpec:
    """One engine process to start. ``command`` must make the server listen on
    ``127.0.0.1:port`` and answer ``/health`` and ``/v1/models`` (listing
    ``model_name``); ``env`` is added to this process's environment."""

    command: tuple[str, ...]
    port: int
    model_name: str
    kind: str
    log_path: Path
    host: str = "127.0.0.1"
    env: Mapping[str, str] = field(default_factory=dict)
    block_size: int | None = None
    kv_cache_tokens: int | None = None  # known in advance (llama-server: its context)
    kv_events: KVEventPorts | None = None
    startup_timeout_s: float = 600.0
    stop_grace_s: float = 10.0

    def __post_init__(self) -> None:
        check_loopback(self.host)
        if not self.command or not all(isinstance(arg, str) for arg in self.command):
            raise ConfigError("an engine command is a non-empty sequence of strings")
        if not (isinstance(self.port, int) and 0 < self.port < 65536):
            raise ConfigError(f"port {self.port!r} is not in 1..65535")
        if not (
            is_finite_positive(self.startup_timeout_s) and is_finite_at_least(self.stop_grace_s, 0)
        ):
            raise ConfigError(
                "startup_timeout_s must be a positive number of seconds and stop_grace_s a "
                f"number >= 0, got {self.startup_timeout_s!r} and {self.stop_grace_s!r}"
            )


class _Attached:
    """Engines this process started and has neither stopped nor detached: the one
    module-level state of the package, so that :func:`atexit` can stop them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engines: set[RunningEngine] = set()

    def add(self, engine: RunningEngine) -> None:
        with self._lock:
            self._engines.add(engine)

    def discard(self, engine: RunningEngine) -> None:
        with self._lock:
            self._engines.discard(engine)

    def stop_all(self) -> None:
        with self._lock:
            engines = list(self._engines)
        for engine in engines:
            engine.stop()


_ATTACHED = _Attached()
atexit.register(_ATTACHED.stop_all)


def stop_all_engines() -> None:
    """Stop every engine this process started and has not detached (also run at exit)."""
    _ATTACHED.stop_all()


def launch_engine(spec: LaunchSpec) -> RunningEngine:
    """Start ``spec.command`` under the watchdog and wait until it serves
    ``spec.model_name``. On failure or Ctrl-C the process group is stopped before the
    error propagates (:class:`EngineStartError` with the log's tail)."""
    # as the engine binds it (SO_REUSEADDR): the closed connections of an engine just
    # stopped on this port (TIME_WAIT, a minute) do not keep a new one from starting
    if not _port_is_free(spec.port, reuse=True):
        raise EngineStartError(f"port {spec.port} on 127.0.0.1 is already in use")
    engine = _spawn(spec)
    try:
        _wait_until_serving(engine, spec)
        engine.kv_cache_tokens = _kv_cache_tokens(engine, spec)
    except BaseException:
        engine.stop()
        raise
    return engine


def _start_process(spec: LaunchSpec) -> tuple[subprocess.Popen[bytes], int]:
    """``spec.command`` started under the watchdog, its output appended to the log;
    the process and where its output starts in the log."""
    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
    watchdog = [sys.executable, str(_WATCHDOG), "--parent", str(os.getpid())]
    with spec.log_path.open("ab") as log:
        log_offset = log.tell()
        log.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(spec.command)}\n".encode())
        log.flush()
        process = subprocess.Popen(
            [*watchdog, "--grace", str(spec.stop_grace_s), "--", *spec.command],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **spec.env},
            start_new_session=True,
        )
    return process, log_offset


def _spawn(spec: LaunchSpec) -> RunningEngine:
    process, log_offset = _start_process(spec)
    engine = RunningEngine(
        kind=spec.kind,
        model_name=spec.model_name,
        port=spec.port,
        process=process,
        command=spec.command,
        log_path=spec.log_path,
        log_offset=log_offset,
        block_size=spec.block_size,
        stop_grace_s=spec.stop_grace_s,
        kv_events=spec.kv_events,
        env=spec.env,
        on_release=_ATTACHED.discard,
        relaunch=functools.partial(_relaunch, spec),
    )
    _ATTACHED.add(engine)
    return engine


def _relaunch(spec: LaunchSpec, engine: RunningEngine) -> None:
    """Start ``spec.command`` again for ``engine`` (stopped) on the same port and wait
    until it serves; on failure the new process is stopped before the error
    propagates."""
    deadline = time.monotonic() + _PORT_RELEASE_S
    while not _port_is_free(spec.port, reuse=True):
        if time.monotonic() > deadline:
            raise EngineStartError(f"port {spec.port} on 127.0.0.1 was not released")
        time.sleep(0.1)
    process, log_offset = _start_process(spec)
    engine._replace_process(process, log_offset)
    _ATTACHED.add(engine)
    try:
        _wait_until_serving(engine, spec)
    except BaseException:
        engine.stop()
        raise


def read_log(path: Path, offset: int = 0) -> str:
    """A log file from byte ``offset`` on ('' if unreadable)."""
    with contextlib.suppress(OSError), path.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")
    return ""


def log_tail(path: Path, lines: int = 25, offset: int = 0) -> str:
    """The last ``lines`` lines of a log file, from byte ``offset`` on."""
    return "\n".join(read_log(path, offset).splitlines()[-lines:])


def _serves_model(client: httpx.Client, engine: RunningEngine) -> bool:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        if client.get(f"{engine.root_url}/health", timeout=2.0).status_code != 200:
            return False
        models = client.get(f"{engine.base_url}/models", timeout=5.0).json()
        return any(item.get("id") == engine.model_name for item in models.get("data", []))
    return False


def _wait_until_serving(engine: RunningEngine, spec: LaunchSpec) -> None:
    deadline = time.monotonic() + spec.startup_timeout_s
    with httpx.Client(trust_env=False) as client:
        while time.monotonic() < deadline:
            if engine.exited():
                raise EngineStartError(
                    f"{spec.kind} exited during start-up (log: {spec.log_path})",
                    spec.log_path,
                    log_tail(spec.log_path, offset=engine.log_offset),
                )
            if _serves_model(client, engine):
                return
            time.sleep(0.25)
    raise EngineStartError(
        f"{spec.kind} did not serve {spec.model_name!r} within {spec.startup_timeout_s:g} s "
        f"(log: {spec.log_path})",
        spec.log_path,
        log_tail(spec.log_path, offset=engine.log_offset),
    )


def _kv_cache_tokens(engine: RunningEngine, spec: LaunchSpec) -> int | None:
    if spec.kind != "vllm":
        return spec.kv_cache_tokens
    with contextlib.suppress(httpx.HTTPError), httpx.Client(trust_env=False) as client:
        tokens = kv_cache_tokens_from_metrics(client.get(f"{engine.root_url}/metrics").text)
        if tokens is not None:
            return tokens
    from_log = kv_cache_tokens_from_log(read_log(spec.log_path, engine.log_offset))
    return spec.kv_cache_tokens if from_log is None else from_log


def normalise_extra_args(extra_args: Sequence[str]) -> tuple[str, ...]:
    """``extra_args`` as a tuple of strings (a bare string is refused: it would be
    split into characters)."""
    if isinstance(extra_args, str) or not all(isinstance(arg, str) for arg in extra_args):
        raise ConfigError("extra_args is a sequence of strings, e.g. ('--seed', '0')")
    if any(_names_forbidden_flag(arg) for arg in extra_args):
        raise ConfigError("the engine's --host and --port are set by start_engine, not extra_args")
    return tuple(extra_args)


def _names_forbidden_flag(arg: str) -> bool:
    """Whether ``arg`` sets ``--host`` or ``--port``, also abbreviated as argparse
    (vLLM's parser) accepts it: ``--ho 0.0.0.0``, ``--por=9``."""
    flag = arg.split("=")[0]
    return len(flag) > 3 and any(name.startswith(flag) for name in _FORBIDDEN_FLAGS)
