"""Errors of the engine manager: a small branch of the package's error hierarchy."""

from __future__ import annotations

from pathlib import Path

from ..errors import ContextPilotError

__all__ = ["EngineError", "EngineInstallError", "EngineNotInstalledError", "EngineStartError"]


class EngineError(ContextPilotError, RuntimeError):
    """An inference engine could not be installed, started or stopped."""


class EngineInstallError(EngineError):
    """An install step failed. ``log_path``: the full output of the failed command;
    ``log_tail``: its last lines, for the message a user sees."""

    def __init__(self, message: str, log_path: Path | None = None, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_path = log_path
        self.log_tail = log_tail


class EngineNotInstalledError(EngineError):
    """The engine or its model is not installed: run ``contextpilot-rag engine install``."""


class EngineStartError(EngineError):
    """The engine process exited, or did not answer ``/health`` in time. ``log_path``:
    the server's log; ``log_tail``: its last lines."""

    def __init__(self, message: str, log_path: Path | None = None, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_path = log_path
        self.log_tail = log_tail
