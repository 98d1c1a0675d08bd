"""Engine KV-cache events: an exact mirror of the engine's prefix cache, kept from
vLLM's ``--kv-events-config`` ZMQ feed, and a tracker that corrects the pilot's
context index from it (see ``docs/kv_events.md``).

The events, the mirror and the tracker are pure. :class:`KVEventSubscriber` needs the
``kv-events`` extra (pyzmq, msgspec) and :func:`engine_token_ids` httpx; both are
imported on first use, so importing this package needs neither.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .events import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, EventBatch, KVEvent
from .mirror import KVCacheMirror, MirrorChange, MirrorStats, content_keys
from .tracker import ChangeFeed, KVCacheTracker, TrackerStats, context_end_tokens

if TYPE_CHECKING:
    from .engine_tokens import engine_token_ids
    from .subscriber import KVEventSubscriber, MirrorListener, SubscriberStats

__all__ = [
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "ChangeFeed",
    "EventBatch",
    "KVCacheMirror",
    "KVCacheTracker",
    "KVEvent",
    "KVEventSubscriber",
    "MirrorChange",
    "MirrorListener",
    "MirrorStats",
    "SubscriberStats",
    "TrackerStats",
    "content_keys",
    "context_end_tokens",
    "engine_token_ids",
]

_LAZY = {
    "KVEventSubscriber": ".subscriber",
    "MirrorListener": ".subscriber",
    "SubscriberStats": ".subscriber",
    "engine_token_ids": ".engine_tokens",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
