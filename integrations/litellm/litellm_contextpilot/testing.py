"""The real LiteLLM proxy server as a child process on loopback, for tests and benchmarks.

The proxy is LiteLLM's ``proxy`` extra (``pip install "litellm-contextpilot[proxy]"``),
often installed in an environment of its own: :func:`find_proxy_python` picks the first
of some Python interpreters that has it, and :class:`LiteLLMProxy` runs
``python -m litellm.proxy.proxy_cli --config config.yaml`` with it, offline (LiteLLM's
bundled model-cost map, no telemetry, no database) and behind a master key of its own::

    proxy = LiteLLMProxy(
        "rag-model",
        [engine.base_url for engine in fleet],
        callbacks_source=CALLBACKS,  # the text of contextpilot_callbacks.py
        callbacks=("contextpilot_callbacks.hook", "contextpilot_callbacks.strategy"),
    )
    with proxy:
        client = openai.OpenAI(base_url=proxy.base_url, api_key=proxy.api_key)

Nothing here imports the proxy: it runs in the child only.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.lifecycle import Startable

__all__ = ["CALLBACKS_MODULE", "LiteLLMProxy", "find_proxy_python", "installed_versions"]

CALLBACKS_MODULE = "contextpilot_callbacks"
"""The module name :class:`LiteLLMProxy` gives ``callbacks_source``, next to the config."""

_PROXY_DISTRIBUTIONS = (
    "litellm",
    "fastapi",
    "uvicorn",
    "backoff",
    "apscheduler",  # the proxy server imports it at start (its `proxy` extra installs it)
    "litellm-contextpilot",
)
_OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the model-cost map
    "LITELLM_TELEMETRY": "False",
    "LITELLM_DONT_SHOW_FEEDBACK_BOX": "True",
}


def installed_versions(python: str | os.PathLike[str], names: Sequence[str]) -> dict[str, str]:
    """The versions of the distributions ``names`` installed for the interpreter
    ``python`` (``pip show``, keyed by lower-case name); missing ones are left out."""
    shown = subprocess.run(
        [os.fspath(python), "-m", "pip", "show", *names], capture_output=True, text=True
    )
    versions: dict[str, str] = {}
    name = None
    for line in shown.stdout.splitlines():
        key, _, value = line.partition(": ")
        if key == "Name":
            name = value.strip().lower().replace("_", "-")
        elif key == "Version" and name is not None:
            versions[name] = value.strip()
    return versions


def find_proxy_python(candidates: Sequence[str | os.PathLike[str] | None]) -> str | None:
    """The first of ``candidates`` (paths of Python interpreters; ``None`` entries are
    skipped) with LiteLLM's proxy and this package installed, or ``None``. Asked of
    pip, without importing anything (the proxy takes seconds to import)."""
    for candidate in candidates:
        if candidate is None or not Path(candidate).is_file():
            continue
        if len(installed_versions(candidate, _PROXY_DISTRIBUTIONS)) == len(_PROXY_DISTRIBUTIONS):
            return os.fspath(candidate)
    return None


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class LiteLLMProxy(Startable):
    """LiteLLM's proxy server over ``api_bases`` (OpenAI-compatible engines, each an
    ``openai/<model>`` deployment of the model group ``model``), on a free port of
    ``host``.

    ``routing_strategy``: the router's (``router_settings.routing_strategy``).
    ``callbacks``: ``litellm_settings.callbacks`` (``module.attribute`` names);
    ``callbacks_source``: the text of a module :data:`CALLBACKS_MODULE` written next to
    the config, for them to name. ``python``: the interpreter with the proxy (default:
    this one); ``pythonpath``: directories added to its ``PYTHONPATH``.
    ``settings``: more top-level config sections, merged over the generated ones.

    :meth:`start` returns once ``/health/liveliness`` answers (within
    ``startup_timeout_s``); the proxy's output is in :attr:`log_path`. :meth:`stop`
    ends the child's process group (SIGTERM, then SIGKILL).
    """

    def __init__(
        self,
        model: str,
        api_bases: Sequence[str],
        *,
        routing_strategy: str = "simple-shuffle",
        callbacks: Sequence[str] = (),
        callbacks_source: str | None = None,
        settings: Mapping[str, Any] | None = None,
        python: str = sys.executable,
        pythonpath: Sequence[str | os.PathLike[str]] = (),
        host: str = "127.0.0.1",
        startup_timeout_s: float = 180.0,
    ) -> None:
        if not api_bases:
            raise ConfigError("the proxy needs at least one api_base")
        self.model = model
        self.config: dict[str, Any] = {
            "model_list": [
                {
                    "model_name": model,
                    "litellm_params": {
                        "model": f"openai/{model}",
                        "api_base": base,
                        "api_key": "loopback",
                    },
                }
                for base in api_bases
            ],
            "router_settings": {"routing_strategy": routing_strategy, "num_retries": 0},
            "litellm_settings": {"callbacks": list(callbacks)} if callbacks else {},
            **dict(settings or {}),
        }
        self.callbacks_source = callbacks_source
        self.python = python
        self.pythonpath = [os.fspath(p) for p in pythonpath]
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.api_key = f"sk-{secrets.token_hex(32)}"
        self.port = 0
        self._directory: tempfile.TemporaryDirectory[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """``http://<host>:<port>/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def log_path(self) -> Path:
        if self._directory is None:
            raise RuntimeError("the proxy was not started")
        return Path(self._directory.name) / "proxy.log"

    def log_tail(self, characters: int = 4000) -> str:
        """The end of the proxy's output (for an error message)."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-characters:]
        except (OSError, RuntimeError):
            return ""

    def start(self) -> LiteLLMProxy:
        self._directory = tempfile.TemporaryDirectory(prefix="litellm-proxy-")
        directory = Path(self._directory.name)
        (directory / "config.yaml").write_text(json.dumps(self.config, indent=2))  # YAML ⊃ JSON
        if self.callbacks_source is not None:
            (directory / f"{CALLBACKS_MODULE}.py").write_text(self.callbacks_source)
        self.port = _free_port(self.host)
        command = [
            self.python, "-m", "litellm.proxy.proxy_cli",
            "--config", str(directory / "config.yaml"),
            "--host", self.host, "--port", str(self.port), "--num_workers", "1",
        ]  # fmt: skip
        with open(self.log_path, "wb") as log:  # the child keeps its own copy
            self._process = subprocess.Popen(
                command,
                cwd=directory,
                env=self._environment(directory),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, ended as one in stop()
            )
        try:
            self._wait_until_live()
        except BaseException:
            self.stop()
            raise
        return self

    def _environment(self, directory: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        env.update(_OFFLINE_ENV)
        env["LITELLM_MASTER_KEY"] = self.api_key
        paths = [str(directory), *self.pythonpath, env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        return env

    def _wait_until_live(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        url = f"http://{self.host}:{self.port}/health/liveliness"
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"the LiteLLM proxy exited at startup:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the LiteLLM proxy did not answer within {self.startup_timeout_s:.0f} s:"
                    f"\n{self.log_tail()}"
                )
            try:
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    def stop(self) -> None:
        process, self._process = self._process, None
        directory, self._directory = self._directory, None
        try:
            if process is not None and process.poll() is None:
                _end(process)
        finally:
            if directory is not None:
                directory.cleanup()


def _end(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the child's group, then SIGKILL if it has not exited within a while
    (or the wait was interrupted: Ctrl-C during a stop still ends the proxy)."""
    _signal_group(process, signal.SIGTERM)
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if process.poll() is None:
            _signal_group(process, signal.SIGKILL)
            process.wait(10)


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group has ended already
        os.killpg(process.pid, signum)  # the child leads its own group (start_new_session)
