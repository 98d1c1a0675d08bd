"""Installing an engine and a model under the engine home, idempotently.

An install is a short list of steps (engine, model file, vLLM conversion); each finds
its artefact complete and is skipped, or builds it and marks it complete last (a stamp
file, or a rename from ``.partial``). Running it again therefore does no work, and an
interrupted run resumes where it stopped. Command output goes to
``<home>/logs/install-<engine>.log``; progress goes to an optional callback.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ._commands import StepOutcome
from ._llama_build import ensure_llama_server
from ._model_fetch import ensure_gguf, ensure_hf_model
from ._stamps import read_stamp
from ._vllm_install import ensure_vllm
from .home import EngineLayout
from .models import EngineKind, ModelSpec, check_engine_kind, model_spec

__all__ = [
    "InstallEvent",
    "InstallProgress",
    "InstalledEngine",
    "install_engine",
    "installed_engine",
]

StepState = Literal["start", "done", "skipped", "adopted", "failed"]


@dataclass(frozen=True)
class InstallEvent:
    """A step started (``state="start"``) or ended after ``elapsed_s`` seconds."""

    step: str
    state: StepState
    elapsed_s: float = 0.0


InstallProgress = Callable[[InstallEvent], None]


@dataclass(frozen=True)
class InstalledEngine:
    """A complete install: the engine's ``executable`` (the vLLM venv's python, or the
    llama-server binary) and the ``model_path`` it serves (a Hugging Face directory for
    vLLM, a GGUF file for llama-server)."""

    kind: EngineKind
    model: ModelSpec
    home: Path
    executable: Path
    model_path: Path
    version: str
    size_bytes: int

    @property
    def layout(self) -> EngineLayout:
        return EngineLayout(self.home)


def _layout(home: Path | None) -> EngineLayout:
    return EngineLayout.default() if home is None else EngineLayout(Path(home))


def installed_engine(
    kind: EngineKind = "vllm", model: str = "smollm2", *, home: Path | None = None
) -> InstalledEngine | None:
    """The install of ``kind`` serving ``model``, or ``None`` if any part is missing.
    Cheap (reads files only): fine for a test's skip condition."""
    kind = check_engine_kind(kind)
    spec = model_spec(kind, model)
    layout = _layout(home)
    stamp = read_stamp(layout.stamp(kind))
    if kind == "vllm":
        executable, model_path = layout.vllm_python, spec.hf_path(layout.models_dir)
        model_ready = (model_path / "config.json").is_file()
    else:
        executable, model_path = layout.llama_server, spec.gguf_path(layout.models_dir)
        model_ready = model_path.is_file()
    if stamp is None or not model_ready or not os.access(executable, os.X_OK):
        return None
    return InstalledEngine(
        kind, spec, layout.home, executable, model_path, stamp.version, stamp.size_bytes
    )


@contextlib.contextmanager
def _install_lock(layout: EngineLayout) -> Iterator[None]:
    """One install at a time per engine home (a second waits)."""
    layout.home.mkdir(parents=True, exist_ok=True)
    with (layout.home / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run_step(report: InstallProgress, step: str, action: Callable[[], StepOutcome]) -> None:
    report(InstallEvent(step, "start"))
    started = time.monotonic()
    try:
        outcome = action()
    except BaseException:
        report(InstallEvent(step, "failed", time.monotonic() - started))
        raise
    report(InstallEvent(step, outcome, time.monotonic() - started))


_Step = tuple[str, Callable[[], StepOutcome]]


def _steps(kind: EngineKind, spec: ModelSpec, layout: EngineLayout) -> list[_Step]:
    log = layout.logs_dir / f"install-{kind}.log"
    model_step = (f"model {spec.gguf_file}", lambda: ensure_gguf(layout, spec, log))
    if kind == "vllm":
        return [
            ("vLLM CPU venv", lambda: ensure_vllm(layout, log)),
            model_step,
            (f"convert for vLLM ({spec.hf_dir})", lambda: ensure_hf_model(layout, spec, log)),
        ]
    return [("build llama-server", lambda: ensure_llama_server(layout, log)), model_step]


def install_engine(
    kind: EngineKind = "vllm",
    model: str = "smollm2",
    *,
    home: Path | None = None,
    progress: bool | InstallProgress = False,
) -> InstalledEngine:
    """Install ``kind`` and ``model`` under the engine home and return the install;
    does nothing for parts already complete. ``progress``: ``True`` draws a rich
    display on stderr, a callable gets each :class:`InstallEvent`. A failed step raises
    :class:`~contextpilot_rag.engines.EngineInstallError` (with the log's tail)."""
    kind = check_engine_kind(kind)
    spec = model_spec(kind, model)
    layout = _layout(home)
    with contextlib.ExitStack() as stack:
        report = _reporter(progress, stack)
        with _install_lock(layout):
            for step, action in _steps(kind, spec, layout):
                _run_step(report, step, action)
    installed = installed_engine(kind, model, home=layout.home)
    if installed is None:  # every step succeeded, so this is a bug, not a user error
        raise AssertionError(f"{kind} install finished but is not complete in {layout.home}")
    return installed


def _reporter(progress: bool | InstallProgress, stack: contextlib.ExitStack) -> InstallProgress:
    if callable(progress):
        return progress
    if progress:
        from ._progress import rich_install_progress

        return stack.enter_context(rich_install_progress())
    return lambda event: None
