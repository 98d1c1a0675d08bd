"""Convert a GGUF model to Hugging Face safetensors (bfloat16) for vLLM.

    VLLM_VENV/bin/python _convert_gguf.py MODEL.gguf OUT_DIR

Run by the vLLM venv's python (it has transformers and torch), with HF_HUB_OFFLINE=1:
nothing is downloaded. transformers (5.x) dequantizes while loading a GGUF; the model
must then forget its GGUF ``quantization_config`` to be saved, and vLLM must not see it.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path


def convert(gguf: Path, out: Path) -> None:
    transformers = importlib.import_module("transformers")
    source, name = str(gguf.parent), gguf.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(source, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        source, gguf_file=name, dtype="bfloat16"
    )
    # the weights are dequantized already; the GGUF "quantizer" would refuse to save
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    if config.pop("quantization_config", None) is not None:
        config_path.write_text(json.dumps(config, indent=2))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: _convert_gguf.py MODEL.gguf OUT_DIR", file=sys.stderr)
        return 2
    convert(Path(argv[0]), Path(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
