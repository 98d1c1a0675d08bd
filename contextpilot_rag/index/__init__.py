"""The context index: which block sequences were already sent, as a prefix tree."""

from .distance import DEFAULT_ALPHA, context_distance
from .tree import ContextIndex, IndexConfig, IndexStats, MatchResult, RequestId

__all__ = [
    "DEFAULT_ALPHA",
    "ContextIndex",
    "IndexConfig",
    "IndexStats",
    "MatchResult",
    "RequestId",
    "context_distance",
]
