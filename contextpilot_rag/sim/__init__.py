"""Simulators: models of inference-engine behaviour used to evaluate prompt orders
without a GPU."""

from .fleet import Replica, SimResult, SimSummary, default_fleet, simulate
from .prefix_cache import CacheResult, PrefixCacheModel, distinct_block_tokens
from .provider_cache import (
    AnthropicCacheModel,
    CacheBlock,
    ManualClock,
    OpenAIBreakpointCacheModel,
    OpenAIBreakpointUsage,
    OpenAICacheModel,
    OpenAICacheRules,
    OpenAIUsage,
)
from .traces import load_mooncake, load_scbench_kv

__all__ = [
    "AnthropicCacheModel",
    "CacheBlock",
    "CacheResult",
    "ManualClock",
    "OpenAIBreakpointCacheModel",
    "OpenAIBreakpointUsage",
    "OpenAICacheModel",
    "OpenAICacheRules",
    "OpenAIUsage",
    "PrefixCacheModel",
    "Replica",
    "SimResult",
    "SimSummary",
    "default_fleet",
    "distinct_block_tokens",
    "load_mooncake",
    "load_scbench_kv",
    "simulate",
]
