"""A mirror of an engine's prefix cache, kept from its KV-cache events.

The engine names blocks by its own hashes (SHA-256 derived), which this side cannot
recompute. The mirror therefore gives every stored block a *content key* of its own:
the chained hash of (parent's content key, the block's tokens, its extra hash keys),
the first block's parent being :data:`~contextpilot_rag.sim.block_hashes.ROOT_HASH` —
for blocks without extra keys exactly the keys of :mod:`contextpilot_rag.sim.block_hashes`.
Equal content keys stand for equal whole prefixes, so a token sequence can be looked up
without the engine's hash function.

Invariant: ``_blocks`` holds exactly the engine blocks alive according to the events
applied since the last clear, each with its content key (``None`` for a block whose
parent was unknown when it was stored: its content cannot be keyed); ``_alive``
counts, per content key, the engine blocks that carry it (one content may live in
several media or KV-cache groups). A sequence is cached up to its first full block
whose content key is not alive — the engine's own lookup rule. ``len(_blocks) <=
max_blocks``.

The mirror is *exact* while it has seen every event since a state it knew (an empty
cache). A block stored under an unknown parent, a block dropped for the hard cap, or
:meth:`KVCacheMirror.mark_inexact` (a lost event batch) make it inexact; only
:meth:`KVCacheMirror.clear` (the engine's cache is known empty) makes it exact again.
Thread-safe: one lock guards all state.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from ..errors import ConfigError, InvalidInputError
from ..sim.block_hashes import ROOT_HASH
from .events import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, KVEvent

__all__ = ["KVCacheMirror", "MirrorChange", "MirrorStats", "content_keys"]

DEFAULT_MAX_BLOCKS = 524_288

_Location = tuple[str | None, int | None]  # (medium, KV-cache group)
_EngineKey = tuple[_Location, BlockHash]
_EVENT_TYPES = (BlockStored, BlockRemoved, AllBlocksCleared)


@dataclass(frozen=True)
class MirrorChange:
    """What applying some events changed. ``removed``: content keys that stopped being
    cached (none of their engine blocks is alive any more); ``cleared``: the cache was
    emptied at least once (everything before that is gone); ``stored``: engine blocks
    added. Changes combine with ``|`` (apply order: the later state wins when read)."""

    removed: frozenset[int] = frozenset()
    cleared: bool = False
    stored: int = 0

    def __or__(self, other: MirrorChange) -> MirrorChange:
        return MirrorChange(
            removed=self.removed | other.removed,
            cleared=self.cleared or other.cleared,
            stored=self.stored + other.stored,
        )

    def __bool__(self) -> bool:
        return bool(self.removed) or self.cleared or self.stored > 0


@dataclass(frozen=True)
class MirrorStats:
    """Counters since construction. ``blocks``: engine blocks alive now;
    ``orphans_stored``: blocks stored under a parent the mirror did not know (events
    were missed); ``unknown_removed``: removals of blocks it did not know;
    ``duplicates_stored``: stores of blocks already alive; ``dropped``: blocks dropped
    to keep ``max_blocks``; ``rejected``: stored events of another block size;
    ``unkeyed_stored``: blocks stored without their tokens (held, found by no lookup)."""

    blocks: int
    exact: bool
    stored: int
    removed: int
    cleared: int
    orphans_stored: int
    unknown_removed: int
    duplicates_stored: int
    dropped: int
    rejected: int
    unkeyed_stored: int = 0


def _content_key(parent: int, tokens: tuple[int, ...], extra: tuple[Hashable, ...] | None) -> int:
    if extra is None:
        return hash((parent, tokens))  # as sim.block_hashes
    return hash((parent, tokens, extra))


def content_keys(
    token_ids: Sequence[int], block_size: int, *, cache_salt: str | None = None
) -> Iterator[int]:
    """Content keys of the full ``block_size`` blocks of ``token_ids``, first block
    first. ``cache_salt``: the request's vLLM ``cache_salt`` (an extra key of its
    first block)."""
    tokens = tuple(token_ids)
    parent = ROOT_HASH
    extra: tuple[Hashable, ...] | None = None if cache_salt is None else (cache_salt,)
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = _content_key(parent, tokens[start : start + block_size], extra)
        extra = None
        yield parent


def _check_tokens(token_ids: object) -> Sequence[int]:
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence):
        raise InvalidInputError(
            f"token_ids must be a sequence of ints, got {type(token_ids).__name__}"
        )
    for token in token_ids:
        if not isinstance(token, int) or isinstance(token, bool):
            raise InvalidInputError(f"token_ids must hold ints, got {token!r}")
    return token_ids


class KVCacheMirror:
    """The engine's prefix cache as its events describe it (see the module docstring).

    ``block_size`` must be the engine's (``--block-size``); stored events of another
    size are rejected and make the mirror inexact. ``max_blocks`` bounds memory
    whatever the events say (the engine's cache is bounded; set this above its block
    count)."""

    def __init__(self, block_size: int, *, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        for name, value in (("block_size", block_size), ("max_blocks", max_blocks)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"KVCacheMirror {name} must be an int >= 1, got {value!r}")
        self._block_size = block_size
        self._max_blocks = max_blocks
        self._lock = threading.Lock()
        self._blocks: dict[_EngineKey, int | None] = {}  # insertion order: oldest first
        self._alive: dict[int, int] = {}
        self._exact = True
        self._counts = dict.fromkeys(
            (
                "stored",
                "removed",
                "cleared",
                "orphans_stored",
                "unknown_removed",
                "duplicates_stored",
                "dropped",
                "rejected",
                "unkeyed_stored",
            ),
            0,
        )

    @property
    def block_size(self) -> int:
        """Tokens per engine block."""
        return self._block_size

    @property
    def max_blocks(self) -> int:
        """The most engine blocks the mirror holds."""
        return self._max_blocks

    @property
    def exact(self) -> bool:
        """Whether the mirror has seen every event since the cache was known empty."""
        return self._exact

    def __len__(self) -> int:
        return len(self._blocks)

    def stats(self) -> MirrorStats:
        """A snapshot of the counters."""
        with self._lock:
            return MirrorStats(blocks=len(self._blocks), exact=self._exact, **self._counts)

    # -- events ---------------------------------------------------------------------

    def apply(self, events: Iterable[KVEvent]) -> MirrorChange:
        """Apply events in order. Anything that is not an event raises
        :class:`~contextpilot_rag.errors.InvalidInputError` before any is applied."""
        if isinstance(events, _EVENT_TYPES) or not isinstance(events, Iterable):
            raise InvalidInputError("apply() takes an iterable of KV-cache events")
        batch = list(events)
        for event in batch:
            if not isinstance(event, _EVENT_TYPES):
                raise InvalidInputError(f"not a KV-cache event: {type(event).__name__}")
        change = MirrorChange()
        with self._lock:
            for event in batch:
                change = change | self._apply_one(event)
        return change

    def clear(self) -> MirrorChange:
        """The engine's cache is known empty: forget every block; the mirror is exact."""
        with self._lock:
            return self._clear()

    def mark_inexact(self) -> None:
        """Events were lost: the mirror may differ from the engine until :meth:`clear`."""
        with self._lock:
            self._exact = False

    def _apply_one(self, event: KVEvent) -> MirrorChange:
        if isinstance(event, BlockStored):
            return self._store(event)
        if isinstance(event, BlockRemoved):
            return self._remove(event)
        return self._clear()

    def _clear(self) -> MirrorChange:
        removed = frozenset(self._alive)
        self._blocks.clear()
        self._alive.clear()
        self._exact = True
        self._counts["cleared"] += 1
        return MirrorChange(removed=removed, cleared=True)

    def _store(self, event: BlockStored) -> MirrorChange:
        """Store ``event``'s blocks. Blocks stored without their tokens (vLLM's offload
        placeholders) are held under the engine's hashes with no content key (so that
        their removal is known, and blocks stored under them are no orphans); the
        mirror stays exact about every content it can look up."""
        unkeyed = not event.token_ids
        if not unkeyed and event.block_size != self._block_size:
            self._counts["rejected"] += 1
            self._exact = False
            return MirrorChange()
        location: _Location = (event.medium, event.group_idx)
        parent = None if unkeyed else self._parent_key(location, event.parent_block_hash)
        removed: set[int] = set()
        stored = 0
        for index, block_hash in enumerate(event.block_hashes):
            engine_key = (location, block_hash)
            key = None
            if parent is not None and not unkeyed:
                key = _content_key(parent, event.block_tokens(index), event.block_extra(index))
            if engine_key in self._blocks:
                self._counts["duplicates_stored"] += 1
                if key is not None and self._blocks[engine_key] is None:
                    self._blocks[engine_key] = key  # an orphan whose parent is known now
                    self._alive[key] = self._alive.get(key, 0) + 1
            else:
                removed |= self._make_room()
                self._add(engine_key, key)
                self._counts["unkeyed_stored"] += unkeyed
                stored += 1
            parent = self._blocks[engine_key]
        return MirrorChange(removed=frozenset(removed - self._alive.keys()), stored=stored)

    def _parent_key(self, location: _Location, parent_hash: BlockHash | None) -> int | None:
        if parent_hash is None:
            return ROOT_HASH
        engine_key = (location, parent_hash)
        if engine_key in self._blocks:
            return self._blocks[engine_key]
        self._counts["orphans_stored"] += 1
        self._exact = False
        return None

    def _add(self, engine_key: _EngineKey, key: int | None) -> None:
        self._blocks[engine_key] = key
        self._counts["stored"] += 1
        if key is not None:
            self._alive[key] = self._alive.get(key, 0) + 1

    def _make_room(self) -> set[int]:
        removed: set[int] = set()
        while len(self._blocks) >= self._max_blocks:
            oldest = next(iter(self._blocks))
            key = self._discard(oldest)
            if key is not None:
                removed.add(key)
            self._counts["dropped"] += 1
            self._exact = False
        return removed

    def _remove(self, event: BlockRemoved) -> MirrorChange:
        location: _Location = (event.medium, event.group_idx)
        removed: set[int] = set()
        for block_hash in event.block_hashes:
            engine_key = (location, block_hash)
            if engine_key not in self._blocks:
                self._counts["unknown_removed"] += 1
                continue
            key = self._discard(engine_key)
            self._counts["removed"] += 1
            if key is not None:
                removed.add(key)
        return MirrorChange(removed=frozenset(removed - self._alive.keys()))

    def _discard(self, engine_key: _EngineKey) -> int | None:
        """Forget one engine block; returns its content key if no block carries it now."""
        key = self._blocks.pop(engine_key)
        if key is None:
            return None
        left = self._alive[key] - 1
        if left:
            self._alive[key] = left
            return None
        del self._alive[key]
        return key

    # -- lookups --------------------------------------------------------------------

    def block_keys(self, token_ids: Sequence[int], *, cache_salt: str | None = None) -> list[int]:
        """Content keys of the full blocks of ``token_ids`` (see :func:`content_keys`)."""
        tokens = _check_tokens(token_ids)
        return list(content_keys(tokens, self._block_size, cache_salt=cache_salt))

    def cached_prefix_blocks(self, keys: Iterable[int]) -> int:
        """How many leading content keys of ``keys`` are cached now."""
        count = 0
        with self._lock:
            alive = self._alive
            for key in keys:
                if key not in alive:
                    break
                count += 1
        return count

    def cached_prefix_tokens(
        self, token_ids: Sequence[int], *, cache_salt: str | None = None
    ) -> int:
        """How many leading tokens of ``token_ids`` (as the engine tokenized them) its
        cache holds now: full blocks from the start up to the first one not cached.
        vLLM serves at most ``len(token_ids) - 1`` of them (it recomputes the last
        prompt token)."""
        tokens = _check_tokens(token_ids)
        keys = content_keys(tokens, self._block_size, cache_salt=cache_salt)
        return self.cached_prefix_blocks(keys) * self._block_size
