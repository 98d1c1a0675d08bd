"""Cache feedback from framework callbacks: which pilot prompt a model call answered.

A framework (LangChain, LlamaIndex) reports its work as a tree of *runs* (LangChain
runs, LlamaIndex spans), each with a parent, and tells callback handlers when a run
starts and ends. A retriever run that returns the pilot's documents names their
prompt's request id; a model run later returns the engine's usage report.
:class:`CallFeedback` pairs the two and hands the report to
:meth:`ContextPilot.observe_cache <contextpilot_rag.ContextPilot.observe_cache>`, so a
framework handler is a thin mapping of its callbacks onto its methods.

Pairing never guesses. A model call claims, when it starts, the prompt sent earlier
under the same *root* run (the top of its tree), provided exactly one such prompt
waits unclaimed. Prompts whose root run ended unclaimed (a retriever called on its own,
a chain that only retrieves) wait as *orphans*; a model call with none under its root
claims the orphan only when there is exactly one. With ``leftovers="standalone"`` only a
model call made on its own (no run encloses it but the model's own) may: inside an
engine whose first model call runs before its own retrieval (LlamaIndex's
condense-question step), another tree's prompt would be a guess. Anything ambiguous is
dropped and the model call counted
``unmatched``. A model call whose own messages name their prompt (messages built from a
pilot prompt) claims that prompt, and no other. A model call inside another model call
(an LLM whose ``chat`` calls its ``complete``) is the outer call's business and is
ignored. A model call that fails puts its claim back under its root, for the retry or
fallback in the same tree; it never becomes an orphan.

Invariants: a waiting request id is claimed by at most one open model call; every map
is bounded by ``max_runs`` (runs that never end are forgotten oldest first); a failure
to observe is logged and counted, never raised into the framework.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Final, Literal, Protocol, TypeVar

from .errors import ConfigError, InvalidInputError
from .usage import CacheUsage, parse_cache_usage

__all__ = ["CacheObserver", "CallFeedback", "FeedbackCounts"]

logger = logging.getLogger(__name__)

Run = Hashable
"""A framework's run id (LangChain ``UUID``, LlamaIndex span id)."""

_INNER: Final = object()  # a model call inside another one: not observed

_K = TypeVar("_K")
_V = TypeVar("_V")


class CacheObserver(Protocol):
    """What learns the engine's cache truth (:class:`~contextpilot_rag.ContextPilot`)."""

    def observe_cache(self, prompt: str, cached_tokens: int, prompt_tokens: int) -> int: ...


@dataclass(frozen=True)
class FeedbackCounts:
    """What became of the model calls a handler saw. ``observed``: usage reported to the
    pilot (``evicted`` requests in all); ``unmatched``: no prompt could be paired with
    the call without guessing; ``no_usage``: paired, but the answer carried no cache
    information (LangChain ``ChatOpenAI`` streams usage only with
    ``stream_usage=True``); ``failed``: the pilot refused the report (e.g. a request id
    older than ``PilotConfig.max_observed_prompts``)."""

    observed: int = 0
    evicted: int = 0
    unmatched: int = 0
    no_usage: int = 0
    failed: int = 0


class CallFeedback:
    """Pairs model calls with the pilot prompts their context came from, and reports
    each answer's cache usage to ``pilot`` (see the module docstring). Thread-safe:
    frameworks call handlers from worker threads and event loops alike."""

    def __init__(
        self,
        pilot: CacheObserver,
        *,
        max_runs: int = 10_000,
        leftovers: Literal["any", "standalone"] = "any",
    ) -> None:
        if not isinstance(max_runs, int) or isinstance(max_runs, bool) or max_runs < 1:
            raise ConfigError(f"max_runs must be a positive int, got {max_runs!r}")
        if leftovers not in ("any", "standalone"):
            raise ConfigError(f"leftovers must be 'any' or 'standalone', got {leftovers!r}")
        self.pilot = pilot
        self.max_runs = max_runs
        self._leftovers = leftovers
        self._lock = threading.Lock()
        self._parents: OrderedDict[Run, Run | None] = OrderedDict()  # open runs
        self._model_runs: OrderedDict[Run, None] = OrderedDict()  # open runs of a model's own
        # root -> waiting ids, each True when a failed call returned it (never an orphan)
        self._pending: OrderedDict[Run, dict[str, bool]] = OrderedDict()
        self._orphans: OrderedDict[str, None] = OrderedDict()
        self._calls: OrderedDict[Run, object] = OrderedDict()  # model run -> id/None/_INNER
        self._counts = FeedbackCounts()

    @property
    def counts(self) -> FeedbackCounts:
        """The counters so far (a snapshot)."""
        return self._counts

    def run_started(self, run: Run, parent: Run | None, *, of_model: bool = False) -> None:
        """A run started under ``parent`` (``None``: a root). ``of_model``: the run is
        one of a model's own methods (LlamaIndex runs one LLM call as nested spans of
        the LLM's methods); a model call with only such runs above it is made on its
        own."""
        with self._lock:
            _bounded_put(self._parents, run, parent, self.max_runs)
            if of_model:
                _bounded_put(self._model_runs, run, None, self.max_runs)

    def run_ended(self, run: Run) -> None:
        """A run ended (or failed). A root's unclaimed prompts become orphans."""
        with self._lock:
            self._parents.pop(run, None)
            self._model_runs.pop(run, None)
            for request_id, returned in self._pending.pop(run, {}).items():
                if not returned:
                    _bounded_put(self._orphans, request_id, None, self.max_runs)

    def prompt_sent(self, run: Run | None, request_id: str) -> None:
        """Run ``run`` returned the documents of the pilot prompt ``request_id``."""
        with self._lock:
            self._wait(run, request_id)

    def model_started(self, run: Run | None, request_id: str | None = None) -> None:
        """Model run ``run`` (already :meth:`run_started`, when the framework tells
        parents) started: it claims the prompt its context came from, if one is
        unambiguous. ``request_id``: the prompt its own messages name (messages built
        from a pilot prompt), claimed as it is."""
        if run is None:
            return
        with self._lock:
            if self._inside_model_call(run):
                _bounded_put(self._calls, run, _INNER, self.max_runs)
                return
            if request_id is not None:
                self._forget(request_id)
                _bounded_put(self._calls, run, request_id, self.max_runs)
                return
            _bounded_put(self._calls, run, self._claim(run), self.max_runs)

    def model_ended(self, run: Run | None, usage: object) -> None:
        """Model run ``run`` answered with ``usage`` (any report
        :func:`~contextpilot_rag.usage.parse_cache_usage` reads; ``None``: none):
        the claimed prompt is observed. Never raises."""
        with self._lock:
            claim = self._calls.pop(run, None) if run is not None else None
            if run is not None:
                self._parents.pop(run, None)
        if claim is _INNER:
            return
        if not isinstance(claim, str):
            self._count(unmatched=1)
            logger.debug("model run %s: no pilot prompt to pair it with", run)
            return
        try:
            reported = parse_cache_usage(usage)
        except InvalidInputError:
            self._count(no_usage=1)
            logger.debug("model run %s (%s): no cache usage in its answer", run, claim)
            return
        self._observe(claim, reported)

    def model_failed(self, run: Run | None) -> None:
        """Model run ``run`` failed (or the run was no model call): its claim goes back
        under its root, unobserved, for the next model call there (a retry, a
        fallback) and no other. Call it before :meth:`run_ended` reports the run's
        end."""
        if run is None:
            return
        with self._lock:
            claim = self._calls.pop(run, None)
            if isinstance(claim, str):
                self._wait(run, claim, returned=True)

    def _observe(self, request_id: str, reported: CacheUsage) -> None:
        try:
            evicted = self.pilot.observe_cache(
                request_id, reported.cached_tokens, reported.prompt_tokens
            )
        except Exception:  # the user's chain must not fail over feedback
            self._count(failed=1)
            logger.warning("could not observe the cache usage of %s", request_id, exc_info=True)
            return
        self._count(observed=1, evicted=evicted)

    def _count(self, **deltas: int) -> None:
        with self._lock:
            counts = self._counts
            self._counts = FeedbackCounts(
                **{name: getattr(counts, name) + deltas.get(name, 0) for name in _COUNT_FIELDS}
            )

    # -- the run tree (lock held) ------------------------------------------------------

    def _root(self, run: Run | None) -> Run | None:
        """The top of ``run``'s tree, as far as the open runs tell."""
        parents = self._parents
        for _ in range(len(parents) + 1):  # a cycle (misreported parents) ends here
            parent = parents.get(run)
            if parent is None:
                return run
            run = parent
        return run

    def _made_on_its_own(self, run: Run) -> bool:
        """Whether no open run but the model's own encloses model run ``run``."""
        parents = self._parents
        ancestor = parents.get(run)
        for _ in range(len(parents) + 1):  # a cycle (misreported parents) ends here
            if ancestor is None:
                return True
            if ancestor not in self._model_runs:
                return False
            ancestor = parents.get(ancestor)
        return False

    def _inside_model_call(self, run: Run) -> bool:
        parents, calls = self._parents, self._calls
        ancestor = parents.get(run)
        for _ in range(len(parents)):
            if ancestor is None:
                return False
            if ancestor in calls:
                return True
            ancestor = parents.get(ancestor)
        return False

    def _wait(self, run: Run | None, request_id: str, *, returned: bool = False) -> None:
        """``request_id`` waits under ``run``'s root; when no open tree holds ``run``,
        as an orphan, or nowhere if a failed call ``returned`` it."""
        root = self._root(run)
        if root is None or root not in self._parents:
            if not returned:
                _bounded_put(self._orphans, request_id, None, self.max_runs)
            return
        waiting = self._pending.get(root)
        if waiting is None:
            waiting = {}
            _bounded_put(self._pending, root, waiting, self.max_runs)
        waiting[request_id] = waiting.get(request_id, True) and returned

    def _forget(self, request_id: str) -> None:
        """``request_id`` waits nowhere any more: a model call named it."""
        self._orphans.pop(request_id, None)
        for waiting in self._pending.values():
            waiting.pop(request_id, None)

    def _claim(self, run: Run) -> str | None:
        """The one prompt waiting under model run ``run``'s root, else the one orphan
        (with ``leftovers="standalone"``, only for a call made on its own); ``None``
        (and the ambiguous candidates dropped) otherwise."""
        waiting = self._pending.pop(self._root(run), None)
        if waiting:
            if len(waiting) == 1:
                return next(iter(waiting))
            logger.debug("dropped %d prompts of one run: ambiguous", len(waiting))
            return None
        if self._leftovers == "standalone" and not self._made_on_its_own(run):
            return None  # inside an engine: no other tree's prompt
        return self._claim_orphan()

    def _claim_orphan(self) -> str | None:
        """The one orphan; ``None`` (and all orphans dropped) when there are several."""
        if len(self._orphans) == 1:
            return self._orphans.popitem()[0]
        if self._orphans:
            logger.debug("dropped %d unpaired prompts: ambiguous", len(self._orphans))
            self._orphans.clear()
        return None


_COUNT_FIELDS = tuple(FeedbackCounts.__dataclass_fields__)


def _bounded_put(mapping: OrderedDict[_K, _V], key: _K, value: _V, capacity: int) -> None:
    """``mapping[key] = value`` as the newest entry, the oldest dropped past ``capacity``."""
    mapping[key] = value
    mapping.move_to_end(key)
    while len(mapping) > capacity:
        mapping.popitem(last=False)
