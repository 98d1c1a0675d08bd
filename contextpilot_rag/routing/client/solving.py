"""Answering until a verifier accepts (:meth:`RoutingClient.solve`): the rounds, each a
call that excludes every ``(endpoint, model)`` already tried, and the time to a
correct answer (TTCA)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from ...errors import ConfigError, RoutingError
from ..metrics import RoutingMetrics
from ..prompt_keys import PromptInput
from .attempts import CallSpec
from .results import Attempt, ChatResult, SolveResult
from .sse import Kind

__all__ = ["Solving"]


class Solving:
    """The bookkeeping of one solve: the attempts so far (each round's failed
    transports included, in order), the pairs to exclude, the clock. Rounds end at
    ``max_attempts`` answers, an accepted one, or a round whose every attempt failed."""

    def __init__(self, max_attempts: int, metrics: RoutingMetrics | None) -> None:
        if max_attempts < 1:
            raise ConfigError("max_attempts must be >= 1")
        self.max_attempts = max_attempts
        self.metrics = metrics
        self.started = time.monotonic()
        self.logical_id = uuid.uuid4().hex
        self.excluded: frozenset[tuple[str, str]] = frozenset()
        self.attempts: list[Attempt] = []
        self._failures: list[Attempt] = []
        self._accepted: ChatResult | None = None
        self._over = False

    def rounds(
        self, kind: Kind, prompt: PromptInput, params: Mapping[str, Any]
    ) -> Iterator[CallSpec]:
        """The call of each round (its failed transports are appended to the spec's
        ``failures``)."""
        for _ in range(self.max_attempts):
            if self._over:
                return
            self._adopt_failures()
            yield CallSpec(
                kind,
                prompt,
                params,
                logical_id=self.logical_id,
                excluded=self.excluded,
                first_attempt=len(self.attempts),
                failures=self._failures,
            )

    @contextlib.contextmanager
    def round(self) -> Iterator[None]:
        """Run one round: a :class:`RoutingError` (every attempt failed) ends the solve."""
        try:
            yield
        except RoutingError:
            self._over = True

    def judged(self, answer: ChatResult, ok: bool) -> None:
        """Record a verified answer; an accepted one ends the solve."""
        self._adopt_failures()
        self.attempts.append(Attempt(answer.endpoint, answer.model, answer.e2e_s, correct=ok))
        if ok:
            self._accepted, self._over = answer, True
        else:
            self.excluded |= {(answer.decision.replica_id, answer.model)}

    def result(self) -> SolveResult:
        self._adopt_failures()
        elapsed_s = time.monotonic() - self.started
        result = SolveResult(self._accepted, tuple(self.attempts), elapsed_s)
        if self.metrics is not None:
            self.metrics.solved(result.ttca_s, result.correct)
        return result

    def _adopt_failures(self) -> None:
        self.attempts += self._failures
        self._failures = []
