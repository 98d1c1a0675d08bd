"""The KV-cache events an engine publishes, as small immutable values.

They follow vLLM's ``vllm/distributed/kv_events.py`` (``BlockStored``,
``BlockRemoved``, ``AllBlocksCleared`` inside an ``EventBatch``), keeping the fields
a cache mirror needs. :mod:`.wire` decodes them from vLLM's msgpack wire format;
this module is pure and validates values built by hand.

A block hash is the engine's own key of a full block: an unsigned 64-bit int (the
low 64 bits of vLLM's SHA-256 chained hash) or, with
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``, the raw hash bytes.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import TypeAlias

from ..errors import InvalidInputError

__all__ = [
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KVEvent",
]

BlockHash: TypeAlias = int | bytes
"""An engine block hash: an int in ``[0, 2**64)`` or raw hash bytes."""

_UINT64_LIMIT = 1 << 64


def _check_hash(name: str, value: object) -> None:
    if isinstance(value, bytes) and value:
        return
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _UINT64_LIMIT:
        return
    raise InvalidInputError(f"{name} must be a uint64 int or non-empty bytes, got {value!r}")


def _check_optional_int(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise InvalidInputError(f"{name} must be an int or None, got {value!r}")


@dataclass(frozen=True)
class BlockStored:
    """Full blocks the engine just cached: ``block_hashes[i]`` holds
    ``token_ids[i * block_size : (i + 1) * block_size]``, and its parent is
    ``block_hashes[i - 1]`` (``parent_block_hash`` for the first; ``None`` when the
    run starts at the beginning of a sequence).

    Empty ``token_ids`` (any ``block_size``, ``0`` included): blocks the engine stored
    without sending their tokens (vLLM's placeholders for blocks offloaded to another
    medium); the mirror holds them without content, so no lookup finds them.

    ``extra_keys`` has one entry per block (or is ``None``): what besides the tokens
    went into the block's hash (a LoRA name, multimodal ids, the request's
    ``cache_salt`` on its first block), as hashable tuples. ``medium`` and
    ``group_idx`` say where the block lives (``"GPU"`` even on vLLM's CPU build; the
    KV-cache group of hybrid models)."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    extra_keys: tuple[tuple[Hashable, ...] | None, ...] | None = None
    medium: str | None = None
    group_idx: int | None = None
    lora_id: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.block_hashes, tuple) or not self.block_hashes:
            raise InvalidInputError("BlockStored.block_hashes must be a non-empty tuple")
        for value in self.block_hashes:
            _check_hash("BlockStored.block_hashes[]", value)
        if self.parent_block_hash is not None:
            _check_hash("BlockStored.parent_block_hash", self.parent_block_hash)
        size = self.block_size
        unkeyed = self.token_ids == ()  # placeholders: tokens not sent (vLLM offloading)
        if not isinstance(size, int) or isinstance(size, bool) or size < (0 if unkeyed else 1):
            raise InvalidInputError(f"BlockStored.block_size must be an int >= 1, got {size!r}")
        if not isinstance(self.token_ids, tuple) or not (
            unkeyed or len(self.token_ids) == size * len(self.block_hashes)
        ):
            raise InvalidInputError(
                "BlockStored.token_ids must be a tuple of block_size tokens per block hash "
                "(or empty: blocks whose tokens the engine did not send)"
            )
        if self.extra_keys is not None:
            if len(self.extra_keys) != len(self.block_hashes):
                raise InvalidInputError("BlockStored.extra_keys must have one entry per block hash")
            for keys in self.extra_keys:
                try:  # the mirror keys blocks by them: refused here, not mid-batch
                    hash(keys)
                except TypeError as error:
                    raise InvalidInputError(
                        f"BlockStored.extra_keys entries must be hashable: {error}"
                    ) from error
        _check_optional_int("BlockStored.group_idx", self.group_idx)
        _check_optional_int("BlockStored.lora_id", self.lora_id)

    def block_tokens(self, index: int) -> tuple[int, ...]:
        """The tokens of block ``index`` of this event."""
        start = index * self.block_size
        return self.token_ids[start : start + self.block_size]

    def block_extra(self, index: int) -> tuple[Hashable, ...] | None:
        """The extra hash keys of block ``index`` (``None`` when there are none)."""
        if self.extra_keys is None:
            return None
        return self.extra_keys[index]


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks the engine evicted from its prefix cache (vLLM sends one event per
    evicted block)."""

    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None
    group_idx: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.block_hashes, tuple):
            raise InvalidInputError("BlockRemoved.block_hashes must be a tuple")
        for value in self.block_hashes:
            _check_hash("BlockRemoved.block_hashes[]", value)
        _check_optional_int("BlockRemoved.group_idx", self.group_idx)


@dataclass(frozen=True)
class AllBlocksCleared:
    """The engine emptied its prefix cache (``POST /reset_prefix_cache``)."""


KVEvent: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared
"""One KV-cache event."""


@dataclass(frozen=True)
class EventBatch:
    """One published message: its sequence number (from 0, per publisher run), the
    engine's timestamp, the events in order, and the data-parallel rank that sent
    them. ``unknown_events`` counts events of a type this module does not know
    (a newer engine), which were left out."""

    seq: int
    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None
    unknown_events: int = 0
