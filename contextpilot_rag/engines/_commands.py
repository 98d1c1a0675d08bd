"""Running an install command with its output in a log file, not on the terminal."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from .errors import EngineInstallError
from .launch import log_tail

__all__ = ["StepOutcome", "directory_size", "ensure_venv", "run_logged"]

StepOutcome = Literal["done", "skipped", "adopted"]
"""How an install step ended: built now, already complete, or found complete without
its stamp (an install made by hand) and stamped now."""


def run_logged(
    command: Sequence[object],
    *,
    log_path: Path,
    what: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> None:
    """Run ``command`` (each item through ``str``: paths welcome), appending its output
    to ``log_path``; on a non-zero exit, :class:`EngineInstallError` saying ``what``
    failed, with the log's tail."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    args = [str(arg) for arg in command]
    with log_path.open("ab") as log:
        log.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(args)}\n".encode())
        log.flush()
        try:
            code = subprocess.run(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=None if env is None else {**os.environ, **env},
                cwd=cwd,
                check=False,
            ).returncode
        except OSError as error:
            raise EngineInstallError(f"{what}: cannot run {args[0]}: {error}", log_path) from error
    if code != 0:
        raise EngineInstallError(
            f"{what} failed (exit {code}); full output in {log_path}", log_path, log_tail(log_path)
        )


def directory_size(path: Path) -> int:
    """Bytes in the regular files under ``path`` (links not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def ensure_venv(venv: Path, python: Path, *, log_path: Path, what: str) -> None:
    """Make ``venv`` (whose interpreter is ``python``) a venv with a working pip. One
    whose pip does not run — ``venv`` interrupted after it wrote the interpreter but
    before ensurepip finished — is made again from scratch (``--clear``)."""
    if python.exists() and _pip_runs(python):
        return
    run_logged([sys.executable, "-m", "venv", "--clear", venv], log_path=log_path, what=what)


def _pip_runs(python: Path) -> bool:
    try:
        return (
            subprocess.run(
                [str(python), "-m", "pip", "--version"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=120,
                check=False,
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
