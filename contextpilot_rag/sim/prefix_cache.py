"""A model of vLLM's automatic prefix caching, to measure what a prompt order saves.

Only full blocks of ``block_size`` tokens are cacheable. Each block is keyed by its
chained hash (:mod:`.block_hashes`), so two blocks with equal keys stand for equal
whole prefixes. A prompt is served from cache up to its first block that misses.

Invariant: the cache is an LRU of blocks whose parents are all cached too (the set of
cached blocks is closed under taking prefixes). It holds because admitting a prompt
refreshes its blocks so that each block is more recently used than every block after
it, and eviction always takes the least recently used block: a child always leaves
before its parent. After every :meth:`PrefixCacheModel.admit`, ``used_tokens <=
capacity_tokens``.

Requests are modelled as replayed one at a time, so once ``admit`` returns none of the
prompt's blocks are referenced and all of them may be evicted. vLLM frees a finished
request's blocks tail first, which is why the tail of a prompt is evicted before its
head.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice

from ..errors import ConfigError
from .block_hashes import iter_block_hashes

__all__ = ["CacheResult", "PrefixCacheModel", "distinct_block_tokens", "salted_tokens"]


@dataclass(frozen=True)
class CacheResult:
    """What one admitted prompt cost. ``cached_tokens`` is a multiple of the block size
    and never more than ``prompt_tokens``."""

    prompt_tokens: int
    cached_tokens: int

    @property
    def computed_tokens(self) -> int:
        """Tokens the engine must prefill: those not served from cache."""
        return self.prompt_tokens - self.cached_tokens


def _max_cached_tokens(prompt_tokens: int, block_size: int) -> int:
    """The most tokens a prompt may take from cache. As in vLLM, the last prompt token
    is always computed (its logits start the decode), so a prompt that fits exactly
    into cached blocks still recomputes its last block."""
    return max(prompt_tokens - 1, 0) // block_size * block_size


def _validate(block_size: int, capacity_tokens: int | None) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ConfigError(f"block_size must be an integer >= 1, got {block_size!r}")
    check_capacity_tokens(capacity_tokens)


def check_capacity_tokens(capacity_tokens: int | None) -> None:
    """:class:`ConfigError` unless ``capacity_tokens`` is an integer >= 0 or ``None``
    (unbounded): the capacity of a cache model (this one's, and the slot cache's)."""
    if capacity_tokens is None:
        return
    if (
        isinstance(capacity_tokens, bool)
        or not isinstance(capacity_tokens, int)
        or capacity_tokens < 0
    ):
        raise ConfigError(
            f"capacity_tokens must be an integer >= 0 or None (unbounded), got {capacity_tokens!r}"
        )


class PrefixCacheModel:
    """An LRU prefix cache of chained full-token blocks, replayed one request at a time.

    ``capacity_tokens=None`` means unbounded. :meth:`lookup` never changes state;
    :meth:`admit` looks a prompt up, stores all its full blocks, evicts down to capacity
    and adds the prompt to the running totals.
    """

    def __init__(self, *, block_size: int = 16, capacity_tokens: int | None = None) -> None:
        _validate(block_size, capacity_tokens)
        self._block_size = block_size
        self._capacity_tokens = capacity_tokens
        self._capacity_blocks = None if capacity_tokens is None else capacity_tokens // block_size
        # Least recently used first; values are unused.
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._prompt_tokens_total = 0
        self._cached_tokens_total = 0
        self._evicted_blocks = 0

    @property
    def block_size(self) -> int:
        """Tokens per cache block."""
        return self._block_size

    @property
    def capacity_tokens(self) -> int | None:
        """Most tokens the cache holds, or ``None`` for unbounded."""
        return self._capacity_tokens

    @property
    def used_tokens(self) -> int:
        """Tokens currently held in cached blocks."""
        return len(self._blocks) * self._block_size

    @property
    def evicted_tokens(self) -> int:
        """Tokens of the blocks evicted for capacity since the last reset."""
        return self._evicted_blocks * self._block_size

    @property
    def prompt_tokens_total(self) -> int:
        """Sum of ``prompt_tokens`` over every admitted prompt since the last reset."""
        return self._prompt_tokens_total

    @property
    def cached_tokens_total(self) -> int:
        """Sum of ``cached_tokens`` over every admitted prompt since the last reset."""
        return self._cached_tokens_total

    @property
    def hit_ratio(self) -> float:
        """Share of admitted prompt tokens served from cache; 0.0 before any prompt."""
        if self._prompt_tokens_total == 0:
            return 0.0
        return self._cached_tokens_total / self._prompt_tokens_total

    def lookup(self, token_ids: Sequence[int]) -> int:
        """Tokens of ``token_ids`` the cache would serve now. Changes no state."""
        hashes = iter_block_hashes(token_ids, self._block_size)
        return self._cached_tokens(hashes, len(token_ids))

    def admit(self, token_ids: Sequence[int], generated: Sequence[int] = ()) -> CacheResult:
        """Serve ``token_ids`` as one request: count its cache hits, then cache all its
        full blocks with its first block most recently used, and evict to capacity.

        ``generated`` are the tokens the engine decoded after the prompt. vLLM (v1)
        and SGLang keep the KV of decoded tokens too, so full blocks of prompt +
        generated are cached; only the prompt counts towards the totals."""
        hashes = list(iter_block_hashes((*token_ids, *generated), self._block_size))
        result = CacheResult(
            prompt_tokens=len(token_ids),
            cached_tokens=self._cached_tokens(hashes, len(token_ids)),
        )
        self._refresh(hashes)
        self._evict_to_capacity()
        self._prompt_tokens_total += result.prompt_tokens
        self._cached_tokens_total += result.cached_tokens
        return result

    def reset(self) -> None:
        """Empty the cache and zero the running totals."""
        self._blocks.clear()
        self._prompt_tokens_total = 0
        self._cached_tokens_total = 0
        self._evicted_blocks = 0

    def _cached_tokens(self, hashes: Iterable[int], prompt_tokens: int) -> int:
        """Tokens served by the leading run of cached blocks among ``hashes``."""
        max_blocks = _max_cached_tokens(prompt_tokens, self._block_size) // self._block_size
        hits = 0
        for block_hash in islice(hashes, max_blocks):
            if block_hash not in self._blocks:
                break
            hits += 1
        return hits * self._block_size

    def _refresh(self, hashes: Sequence[int]) -> None:
        # Tail first, so the head ends most recently used and is evicted last.
        blocks = self._blocks
        for block_hash in reversed(hashes):
            if block_hash in blocks:
                blocks.move_to_end(block_hash)
            else:
                blocks[block_hash] = None

    def _evict_to_capacity(self) -> None:
        if self._capacity_blocks is None:
            return
        blocks = self._blocks
        while len(blocks) > self._capacity_blocks:
            blocks.popitem(last=False)
            self._evicted_blocks += 1


def salted_tokens(token_ids: Sequence[int], salt: str | None) -> list[int]:
    """``token_ids`` with a ``cache_salt`` mixed into the first one (a negative id,
    which no tokenizer makes): every chained block hash of the prompt then depends on
    the salt, as vLLM's extra key on the first block makes them, so prompts of
    different salts share no cached block in one :class:`PrefixCacheModel`.
    ``salt=None`` (or no tokens) leaves them as they are."""
    tokens = list(token_ids)
    if salt is None or not tokens:
        return tokens
    mixed = hashlib.blake2b(f"{salt}\x00{tokens[0]}".encode(), digest_size=8).digest()
    return [-1 - int.from_bytes(mixed, "big") // 2, *tokens[1:]]


def distinct_block_tokens(prompts: Iterable[Sequence[int]], block_size: int = 16) -> int:
    """Tokens in the distinct chained full blocks of ``prompts``: what an unbounded
    cache would hold after admitting them all. Used to size a bounded cache as a
    fraction of a baseline's cacheable tokens."""
    _validate(block_size, None)
    seen: set[int] = set()
    for token_ids in prompts:
        seen.update(iter_block_hashes(token_ids, block_size))
    return len(seen) * block_size
