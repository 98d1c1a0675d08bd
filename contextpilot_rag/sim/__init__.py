"""Simulators: models of inference-engine behaviour used to evaluate prompt orders
without a GPU."""

from .prefix_cache import CacheResult, PrefixCacheModel, distinct_block_tokens

__all__ = ["CacheResult", "PrefixCacheModel", "distinct_block_tokens"]
