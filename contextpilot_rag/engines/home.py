"""Where installed engines, models, logs and run records live.

Everything the engine manager writes is under one directory, the *engine home*:
``$CONTEXTPILOT_ENGINE_HOME`` if set, else ``${XDG_CACHE_HOME:-~/.cache}/contextpilot-rag/engines``.
The environment is read when :func:`engine_home` is called, never at import time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EngineLayout", "engine_home"]


def engine_home(environ: Mapping[str, str] | None = None) -> Path:
    """The engine home directory (not created)."""
    env = os.environ if environ is None else environ
    explicit = env.get("CONTEXTPILOT_ENGINE_HOME")
    if explicit:
        return Path(explicit).expanduser()
    cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "contextpilot-rag" / "engines"


@dataclass(frozen=True)
class EngineLayout:
    """The paths under one engine home. Invariant: every path is inside ``home``."""

    home: Path

    @classmethod
    def default(cls) -> EngineLayout:
        return cls(engine_home())

    @property
    def vllm_dir(self) -> Path:
        return self.home / "vllm"

    @property
    def vllm_venv(self) -> Path:
        return self.vllm_dir / "venv"

    @property
    def vllm_python(self) -> Path:
        return self.vllm_venv / "bin" / "python"

    @property
    def llama_dir(self) -> Path:
        return self.home / "llama.cpp"

    @property
    def llama_server(self) -> Path:
        return self.llama_dir / "bin" / "llama-server"

    def chat_template(self, name: str) -> Path | None:
        """A chat template the models' publishers ship (``name``, e.g.
        ``"mistralai-Mistral-Nemo-Instruct-2407.jinja"``), from the llama.cpp sources
        the llama-server install keeps (``models/templates``), for
        ``--jinja --chat-template-file``; ``None`` without them."""
        found = sorted(self.llama_dir.glob(f"src/*/vendor/llama.cpp/models/templates/{name}"))
        return found[0] if found else None

    @property
    def tools_venv(self) -> Path:
        """A small venv for downloads and model helpers (never the user's environment)."""
        return self.home / "tools" / "venv"

    @property
    def tools_python(self) -> Path:
        return self.tools_venv / "bin" / "python"

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    def stamp(self, kind: str) -> Path:
        """Written last by a successful install of ``kind``."""
        directory = self.vllm_dir if kind == "vllm" else self.llama_dir
        return directory / "installed.json"
