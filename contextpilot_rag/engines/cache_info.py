"""The engine's prefix-cache capacity, read from what the engine itself reports.

vLLM exports ``vllm:cache_config_info`` on ``/metrics`` (an info gauge whose labels hold
``num_gpu_blocks`` and ``block_size`` — "gpu" even on the CPU build) and logs
``CPU KV cache size: 43,690 tokens, ...`` at start-up; either gives the number of tokens
the prefix cache can hold.
"""

from __future__ import annotations

import re

__all__ = ["block_size_from_metrics", "kv_cache_tokens_from_log", "kv_cache_tokens_from_metrics"]

_INFO_METRIC = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_LOG_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")


def _cache_config(text: str) -> dict[str, str]:
    match = _INFO_METRIC.search(text)
    return dict(_LABEL.findall(match["labels"])) if match is not None else {}


def block_size_from_metrics(text: str) -> int | None:
    """The prefix-cache block size from a Prometheus ``/metrics`` page, or ``None``."""
    block_size = _cache_config(text).get("block_size", "")
    return int(block_size) if block_size.isdigit() else None


def kv_cache_tokens_from_metrics(text: str) -> int | None:
    """``num_gpu_blocks × block_size`` from a Prometheus ``/metrics`` page, or ``None``."""
    blocks, block_size = (
        _cache_config(text).get("num_gpu_blocks", ""),
        block_size_from_metrics(text),
    )
    if not blocks.isdigit() or block_size is None:
        return None
    return int(blocks) * block_size


def kv_cache_tokens_from_log(text: str) -> int | None:
    """The last ``KV cache size: N tokens`` line of a vLLM server log, or ``None``."""
    sizes = _LOG_LINE.findall(text)
    return int(sizes[-1].replace(",", "")) if sizes else None
