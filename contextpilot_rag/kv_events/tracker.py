"""Keep a :class:`~contextpilot_rag.ContextPilot`'s context index exact with the
engine's KV-cache events.

Every request in the pilot's index stands for a claim: *the engine holds this
request's path* (system prompt, history, context blocks, tail). The tracker
remembers, for each prompt sent (:meth:`KVCacheTracker.track`), the engine's tokens
of that prompt, and checks the claim whenever the engine removes one of their blocks
(or clears its cache). The rule, for a tracked prompt of ``n`` engine tokens whose
context blocks end at engine token ``context_end``:

- the engine still holds its first ``remaining = mirror.cached_prefix_tokens(...)``
  tokens. While ``remaining`` covers every full block up to ``context_end``, the
  claim holds: a loss confined to the tail (notes, question, generated tokens) is
  shared by no other request and changes nothing;
- otherwise the claim is broken inside the context: the tracker calls
  :meth:`~contextpilot_rag.ContextPilot.observe_cache` (``tolerance=0``) with the
  prompt's claim as the prediction (its whole path reusable) and, as the tokens
  served, the position of the last token of the first lost engine block, so that the
  pilot evicts every *other* request whose path shares the node holding that token
  (they share the lost block), tracked or not; then it evicts the prompt itself, because
  the index cannot shorten a request's path and keeping it would claim blocks the
  engine no longer holds. The still-cached head is forgotten with it: a prediction
  that falls short costs one reordering opportunity, one that overshoots sends the
  next request down a path the engine no longer has.

While the event source is not synced (:attr:`KVEventSubscriber.synced`, or the
mirror's :attr:`~.mirror.KVCacheMirror.exact`) the tracker does nothing: the pilot's
own bounded capacity model (:class:`~contextpilot_rag.index.IndexConfig`) stays in
charge. The source becomes synced with the engine's cache known empty, and then
every tracked prompt is checked (and, the cache being empty, evicted).

Pilot tokens and engine tokens differ (tokenizer, chat template): engine positions
are mapped to the pilot's in proportion, piecewise around ``context_end`` (given by
the caller, or itself estimated in proportion: :func:`context_end_tokens`).

Bounded: at most ``max_tracked`` prompts (least recently tracked dropped first).
Thread-safe: events arrive on the subscriber's thread; the pilot is called outside
the tracker's lock.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

from ..errors import ConfigError, InvalidInputError
from ..prompt import Prompt
from .events import KVEvent
from .mirror import KVCacheMirror, MirrorChange

if TYPE_CHECKING:
    from ..pilot import ContextPilot

__all__ = ["ChangeFeed", "KVCacheTracker", "TrackerStats", "context_end_tokens"]


class _PromptSalt(enum.Enum):
    """``track``'s default ``cache_salt``: the prompt's own."""

    PROMPT = "the prompt's cache_salt"


_PROMPT_SALT = _PromptSalt.PROMPT


class ChangeFeed(Protocol):
    """What the tracker needs of a live event source (a :class:`KVEventSubscriber`)."""

    @property
    def mirror(self) -> KVCacheMirror: ...

    @property
    def synced(self) -> bool: ...

    def add_listener(self, listener: Callable[[MirrorChange], object]) -> None: ...

    def remove_listener(self, listener: Callable[[MirrorChange], object]) -> None: ...


@dataclass(frozen=True)
class TrackerStats:
    """Counters since construction. ``corrected``: prompts whose claim broke (each
    evicted from the pilot); ``evicted``: requests the pilot evicted for them (the
    prompts and the requests sharing their lost blocks); ``dropped``: prompts
    forgotten for ``max_tracked``; ``unsynced_changes``: changes ignored while the
    source was not synced."""

    tracked: int
    corrected: int
    evicted: int
    dropped: int
    unsynced_changes: int


class _Tracked(NamedTuple):
    prompt: Prompt
    keys: tuple[int, ...]  # the mirror's content keys of the prompt's full blocks
    prompt_tokens: int  # engine tokens
    context_end: int  # engine tokens up to the end of the last context block
    claimed_tokens: int  # engine tokens that must stay cached for the claim to hold

    def pilot_position(self, engine_position: int) -> int:
        """The pilot-token position of an engine-token position: in proportion within
        the context, and within the rest."""
        stats = self.prompt.stats
        boundaries = self.prompt.boundaries
        context = boundaries[-1].token_end if boundaries else 0
        if engine_position < self.context_end:
            position = engine_position * context // self.context_end
        else:
            rest = max(1, self.prompt_tokens - self.context_end)
            position = (
                context
                + (engine_position - self.context_end) * (stats.prompt_tokens - context) // rest
            )
        return max(0, min(position, stats.prompt_tokens - 1))


def context_end_tokens(prompt: Prompt, prompt_tokens: int) -> int:
    """Where ``prompt``'s last context block ends, in engine tokens, estimated in
    proportion from the pilot's token offsets (0 when it sends no block)."""
    if not prompt.boundaries:
        return 0
    end = prompt.boundaries[-1].token_end
    return min(prompt_tokens, end * prompt_tokens // max(1, prompt.stats.prompt_tokens))


def _check_max_tracked(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"max_tracked must be an int >= 1, got {value!r}")
    return value


class KVCacheTracker:
    """Corrects ``pilot``'s index from engine KV-cache events (see the module
    docstring for the rule). ``source`` is a live feed (a started or startable
    :class:`~contextpilot_rag.kv_events.KVEventSubscriber`: the tracker listens to it)
    or a bare :class:`KVCacheMirror` fed through :meth:`apply`."""

    def __init__(
        self,
        pilot: ContextPilot,
        source: ChangeFeed | KVCacheMirror,
        *,
        max_tracked: int = 4096,
    ) -> None:
        self._max_tracked = _check_max_tracked(max_tracked)
        for method in ("observe_cache", "evict"):
            if not callable(getattr(pilot, method, None)):
                raise ConfigError(f"pilot must be a ContextPilot (no {method}())")
        self._pilot = pilot
        self._feed: ChangeFeed | None
        if isinstance(source, KVCacheMirror):
            self._feed, self._mirror = None, source
        elif isinstance(getattr(source, "mirror", None), KVCacheMirror):
            self._feed, self._mirror = source, source.mirror
        else:
            raise ConfigError("source must be a KVEventSubscriber or a KVCacheMirror")
        self._lock = threading.Lock()
        self._tracked: OrderedDict[str, _Tracked] = OrderedDict()  # least recent first
        self._by_key: dict[int, set[str]] = {}
        self._counts = dict.fromkeys(("corrected", "evicted", "dropped", "unsynced_changes"), 0)
        if self._feed is not None:
            self._feed.add_listener(self.handle_change)

    @property
    def mirror(self) -> KVCacheMirror:
        """The mirror the tracker reads."""
        return self._mirror

    @property
    def synced(self) -> bool:
        """Whether corrections are made now (the source is synced)."""
        return self._feed.synced if self._feed is not None else self._mirror.exact

    def close(self) -> None:
        """Stop listening to the feed (tracked prompts are kept)."""
        if self._feed is not None:
            self._feed.remove_listener(self.handle_change)

    def __len__(self) -> int:
        return len(self._tracked)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._tracked

    def stats(self) -> TrackerStats:
        """A snapshot of the counters."""
        with self._lock:
            return TrackerStats(tracked=len(self._tracked), **self._counts)

    # -- tracking ---------------------------------------------------------------------

    def track(
        self,
        prompt: Prompt,
        token_ids: Sequence[int],
        *,
        context_end: int | None = None,
        cache_salt: str | Literal[_PromptSalt.PROMPT] | None = _PROMPT_SALT,
    ) -> None:
        """Watch ``prompt`` (already sent, so in the pilot's index), whose messages the
        engine tokenized as ``token_ids`` (see :func:`engine_token_ids`).
        ``context_end``: the engine token where its last context block ends (default:
        :func:`context_end_tokens`). ``cache_salt``: the ``cache_salt`` the request
        carried (default: the prompt's own, :attr:`Prompt.cache_salt`, as the pilot's
        request shapes send it; ``None``: none was sent). Tracking a request id again
        replaces it."""
        if not isinstance(prompt, Prompt):
            raise InvalidInputError(f"track() takes a Prompt, got {type(prompt).__name__}")
        if isinstance(cache_salt, _PromptSalt):
            cache_salt = prompt.cache_salt
        keys = tuple(self._mirror.block_keys(token_ids, cache_salt=cache_salt))
        count = len(token_ids)
        if count < 1:
            raise InvalidInputError("track() needs the prompt's engine tokens (none given)")
        if context_end is None:
            context_end = context_end_tokens(prompt, count)
        elif isinstance(context_end, bool) or not isinstance(context_end, int):
            raise InvalidInputError("context_end must be an int")
        elif not 0 <= context_end <= count:
            raise InvalidInputError("context_end must lie within the prompt's tokens")
        size = self._mirror.block_size
        entry = _Tracked(prompt, keys, count, context_end, context_end // size * size)
        with self._lock:
            self._forget(prompt.request_id)
            self._tracked[prompt.request_id] = entry
            for key in set(keys):
                self._by_key.setdefault(key, set()).add(prompt.request_id)
            while len(self._tracked) > self._max_tracked:
                self._forget(next(iter(self._tracked)))
                self._counts["dropped"] += 1

    def untrack(self, request_id: str) -> bool:
        """Stop watching a request; returns whether it was tracked."""
        with self._lock:
            return self._forget(request_id)

    def _forget(self, request_id: str) -> bool:
        entry = self._tracked.pop(request_id, None)
        if entry is None:
            return False
        for key in set(entry.keys):
            holders = self._by_key.get(key)
            if holders is not None:
                holders.discard(request_id)
                if not holders:
                    del self._by_key[key]
        return True

    # -- events -----------------------------------------------------------------------

    def apply(self, events: Iterable[KVEvent]) -> int:
        """Apply events to the mirror and correct the pilot (no live subscriber);
        returns how many tracked prompts were corrected."""
        if self._feed is not None:
            raise InvalidInputError("apply() is for a bare mirror; the subscriber feeds this one")
        return self.handle_change(self._mirror.apply(events))

    def handle_change(self, change: MirrorChange) -> int:
        """Check the tracked prompts that ``change`` touched (all of them after a clear)
        against the mirror, and correct the pilot for each broken claim; returns how
        many were corrected. Does nothing while the source is not synced."""
        if not change:
            return 0
        if not self.synced:
            with self._lock:
                self._counts["unsynced_changes"] += 1
            return 0
        broken = self._take_broken(change)
        evicted = sum(self._correct(entry) for entry in broken)
        with self._lock:
            self._counts["corrected"] += len(broken)
            self._counts["evicted"] += evicted
        return len(broken)

    def _take_broken(self, change: MirrorChange) -> list[tuple[_Tracked, int]]:
        """The tracked prompts whose claim no longer holds, with the engine tokens
        still cached of each; they stop being tracked."""
        with self._lock:
            if change.cleared:
                candidates = list(self._tracked)
            else:
                touched: set[str] = set()
                for key in change.removed:
                    touched |= self._by_key.get(key, set())
                candidates = list(touched)  # _by_key names tracked requests only
            broken = []
            for request_id in candidates:
                entry = self._tracked[request_id]
                remaining = self._mirror.cached_prefix_blocks(entry.keys) * self._mirror.block_size
                if remaining < entry.claimed_tokens:
                    broken.append((entry, remaining))
                    self._forget(request_id)
            return broken

    def _correct(self, broken: tuple[_Tracked, int]) -> int:
        entry, remaining = broken
        prompt = entry.prompt
        claim = dataclasses.replace(
            prompt,
            stats=dataclasses.replace(
                prompt.stats,
                blocks_matched=len(prompt.blocks),
                reusable_tokens=prompt.stats.prompt_tokens,
            ),
        )
        last_lost = entry.pilot_position(remaining + self._mirror.block_size - 1)
        evicted = self._pilot.observe_cache(
            claim, last_lost, claim.stats.prompt_tokens, tolerance=0.0
        )
        return evicted + self._pilot.evict([prompt.request_id])
