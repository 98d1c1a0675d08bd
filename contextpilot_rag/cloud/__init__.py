"""Hosted prompt caches (Anthropic, OpenAI, Gemini, and gateways such as LiteLLM):
where cache breakpoints pay, ``prompt_cache_key``, request shapes, prices and money.
See ``docs/cloud.md``."""

from __future__ import annotations

from .breakpoints import Breakpoint, CachePlan, ReuseCandidate, SkippedBreakpoint, plan_breakpoints
from .config import CloudCacheConfig
from .prices import DEFAULT_PRICES, InputCost, ModelPrice, PriceTable, input_cost
from .requests import cache_prefix_bytes
from .rules import (
    ANTHROPIC_RULES,
    OPENAI_BREAKPOINT_MODELS,
    OPENAI_BREAKPOINT_RULES,
    OPENAI_RULES,
    ProviderRules,
    rules_for,
)

__all__ = [
    "ANTHROPIC_RULES",
    "DEFAULT_PRICES",
    "OPENAI_BREAKPOINT_MODELS",
    "OPENAI_BREAKPOINT_RULES",
    "OPENAI_RULES",
    "Breakpoint",
    "CachePlan",
    "CloudCacheConfig",
    "InputCost",
    "ModelPrice",
    "PriceTable",
    "ProviderRules",
    "ReuseCandidate",
    "SkippedBreakpoint",
    "cache_prefix_bytes",
    "input_cost",
    "plan_breakpoints",
    "rules_for",
]
