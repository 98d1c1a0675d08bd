"""A model of llama-server's prompt reuse: one slot and its host-memory prompt cache.

llama-server (llama.cpp's ``tools/server``, the version the project installs) keeps
no block-level prefix cache. A slot holds the tokens of its last request (the prompt
and the generated tokens it decoded), and a request reuses the longest common prefix
of those tokens and its own prompt. With ``--cache-ram`` (on by default) earlier slot
contents are kept in host memory and one may be restored into the slot, under these
rules (``server-context.cpp``, ``get_available_slot``; ``server-task.cpp``,
``server_prompt_cache::alloc`` and ``load``), modelled here for one slot (``-np 1``)
serving one request at a time:

- The slot is taken *by similarity* when the share of the new prompt it holds
  (common prefix over the prompt's length) is above ``--slot-prompt-similarity``
  (0.1 by default); the prompt cache is then updated only when the new prompt keeps
  less than half of the slot's tokens. Otherwise the slot is taken as the least
  recently used one, and the prompt cache is always updated.
- An update first *saves* the slot's tokens as the newest entry, unless an entry
  already holds them as its prefix; entries that are a prefix of them are dropped.
  Then it *restores* the entry that beats the slot on both the share of the entry the
  new prompt keeps and the share of the new prompt it covers, among entries whose kept
  share is at least a quarter (the first such improvement wins, oldest entries first,
  each later one compared with the best so far). A restored entry leaves the cache.
- The request then reuses the common prefix of the slot's tokens and its prompt, less
  one token when that is the whole prompt (its last token is always evaluated).
  Afterwards the slot holds the prompt and every generated token but the last (the
  last sampled token is never decoded).

``capacity_tokens`` bounds the saved entries' tokens (the oldest dropped first);
llama-server bounds them by ``--cache-ram`` MiB, which for a small model holds every
prompt of a benchmark, so ``None`` (unbounded) is the usual choice. Speculative
decoding, context checkpoints of sliding-window models, ``--cache-reuse`` and several
slots are not modelled.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from ..errors import ConfigError
from .prefix_cache import CacheResult, check_capacity_tokens

__all__ = ["LlamaServerCacheModel"]

_SAVE_BELOW_KEEP = 0.5  # a slot taken by similarity is saved when less than this is kept
_RESTORE_FROM_KEEP = 0.25  # an entry is restored only when at least this share is kept
_DEFAULT_SIMILARITY = 0.1  # llama-server's --slot-prompt-similarity default


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two token arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class LlamaServerCacheModel:
    """Tokens llama-server serves from its slot and prompt cache, request by request
    (see the module docstring for the rules). ``prompt_cache=False`` models
    ``--cache-ram 0`` (the slot alone); ``similarity`` is ``--slot-prompt-similarity``.
    Same interface as :class:`~contextpilot_rag.sim.prefix_cache.PrefixCacheModel`'s
    :meth:`admit` and :meth:`reset`."""

    def __init__(
        self,
        *,
        prompt_cache: bool = True,
        capacity_tokens: int | None = None,
        similarity: float = _DEFAULT_SIMILARITY,
    ) -> None:
        check_capacity_tokens(capacity_tokens)
        if not 0.0 <= similarity < 1.0:
            raise ConfigError(f"similarity must be in [0, 1), got {similarity!r}")
        self._prompt_cache = prompt_cache
        self._capacity_tokens = capacity_tokens
        self._similarity = similarity
        self._slot = np.empty(0, dtype=np.int64)
        self._saved: deque[np.ndarray] = deque()  # oldest first
        self._saved_tokens = 0
        self._evicted_tokens = 0

    @property
    def block_size(self) -> int:
        """Reuse is at token granularity."""
        return 1

    @property
    def capacity_tokens(self) -> int | None:
        """The most tokens the saved prompts hold (``None``: unbounded)."""
        return self._capacity_tokens

    @property
    def evicted_tokens(self) -> int:
        """Tokens of saved prompts dropped for capacity since the last reset."""
        return self._evicted_tokens

    @property
    def saved_prompts(self) -> int:
        """Prompts held in the host-memory cache now."""
        return len(self._saved)

    def admit(self, token_ids: Sequence[int], generated: Sequence[int] = ()) -> CacheResult:
        """Serve ``token_ids`` as one request: the tokens it reuses, then the slot
        holds it and ``generated`` but the last."""
        prompt = np.asarray(token_ids, dtype=np.int64)
        slot = self._slot
        kept = _common_prefix(slot, prompt)
        by_similarity = len(slot) > 0 and len(prompt) > 0 and kept / len(prompt) > self._similarity
        update = not by_similarity or kept / len(slot) < _SAVE_BELOW_KEEP
        if update and self._prompt_cache:
            self._save(slot)
            slot = self._restore(slot, prompt, kept)
            kept = _common_prefix(slot, prompt)
        if kept == len(prompt) and kept > 0:
            kept -= 1  # the last prompt token is always evaluated
        tail = np.asarray(list(generated)[:-1], dtype=np.int64)
        self._slot = np.concatenate((prompt, tail)) if len(tail) else prompt
        return CacheResult(prompt_tokens=len(prompt), cached_tokens=kept)

    def reset(self) -> None:
        """An empty slot and prompt cache (a restarted server)."""
        self._slot = np.empty(0, dtype=np.int64)
        self._saved.clear()
        self._saved_tokens = 0
        self._evicted_tokens = 0

    def _save(self, slot: np.ndarray) -> None:
        if len(slot) == 0:
            return
        if any(_common_prefix(entry, slot) == len(slot) for entry in self._saved):
            return  # already held as (a prefix of) an entry
        contained = [e for e in self._saved if _common_prefix(e, slot) == len(e)]
        for entry in contained:
            self._remove(entry)
        self._saved.append(slot)
        self._saved_tokens += len(slot)
        capacity = self._capacity_tokens
        while capacity is not None and self._saved and self._saved_tokens > capacity:
            oldest = self._saved.popleft()
            self._saved_tokens -= len(oldest)
            self._evicted_tokens += len(oldest)

    def _restore(self, slot: np.ndarray, prompt: np.ndarray, kept: int) -> np.ndarray:
        """The slot's tokens after looking for a better saved prompt (removed from the
        cache when restored)."""
        best_keep = kept / len(slot) if len(slot) else -1.0  # an empty slot: any entry wins
        best_share = kept / len(prompt) if len(prompt) else 0.0
        best: np.ndarray | None = None
        for entry in self._saved:
            common = _common_prefix(entry, prompt)
            keep = common / len(entry)
            share = common / len(prompt) if len(prompt) else 0.0
            if keep < _RESTORE_FROM_KEEP:
                continue
            if best_keep < keep and best_share < share:
                best, best_keep, best_share = entry, keep, share
        if best is None:
            return slot
        self._remove(best)
        return best

    def _remove(self, entry: np.ndarray) -> None:
        for i, held in enumerate(self._saved):
            if held is entry:
                del self._saved[i]
                self._saved_tokens -= len(entry)
                return
