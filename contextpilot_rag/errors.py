"""Typed errors. Every public call validates its input and raises one of these
*before* it changes any state, so a failed call leaves the index and the
conversations exactly as they were."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # as httpx types its errors' requests: for the checker only
    from .routing.client.results import Attempt

__all__ = [
    "BlockConflictError",
    "CacheControlError",
    "ConfigError",
    "ContextPilotError",
    "ConversationConflictError",
    "ConversationExpiredError",
    "ConversationStateError",
    "DuplicateRequestError",
    "EmptyContextError",
    "EndpointError",
    "InvalidBlockError",
    "InvalidDecisionError",
    "InvalidInputError",
    "InvalidRouteRequestError",
    "MissingExtraError",
    "NoReplicaAvailableError",
    "OversizeBlockError",
    "ProviderError",
    "RoutingError",
    "StoreError",
    "StoreFormatError",
    "StoreUnavailableError",
    "UnknownConversationError",
]


class ContextPilotError(Exception):
    """Base class of every error raised by contextpilot_rag."""


class ConfigError(ContextPilotError, ValueError):
    """A configuration value is out of range or of the wrong type."""


class MissingExtraError(ConfigError, ImportError):
    """An optional dependency a feature needs is not installed; the message names the
    extra that installs it (``pip install "contextpilot-rag[bm25]"``). Also an
    :class:`ImportError`, as a failed import is."""


class InvalidInputError(ContextPilotError, TypeError):
    """An argument has the wrong type or an unusable value (a query that is not a
    string, a bare string where a list of ids is expected, ...)."""


class InvalidBlockError(InvalidInputError):
    """A context block (or something passed as one) is malformed: wrong type,
    missing or empty text, a non-string id, a non-numeric score."""


class EmptyContextError(ContextPilotError, ValueError):
    """A request carries no context blocks where at least one is required."""


class BlockConflictError(ContextPilotError, ValueError):
    """Two blocks share an id but not their text (within one call or across calls).
    Give distinct ids to distinct texts, or leave ``id`` unset to use content hashes."""


class CacheControlError(ContextPilotError, ValueError):
    """A request breaks a hosted provider's prompt-cache rules as the provider's API
    would reject it: more than 4 ``cache_control`` breakpoints, a ``ttl`` other than
    ``"5m"`` / ``"1h"``, a 1-hour breakpoint after a 5-minute one, an unknown
    ``prompt_cache_retention``. Raised by the emulated caches in
    :mod:`contextpilot_rag.sim.provider_cache`."""


class OversizeBlockError(ContextPilotError, ValueError):
    """A block is longer than the configured ``max_block_tokens``."""


class UnknownConversationError(ContextPilotError, KeyError):
    """The conversation id names no live conversation (never started, or expired)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown conversation"


class ConversationExpiredError(UnknownConversationError):
    """The conversation existed but its store dropped it (idle longer than its TTL, or
    evicted to bound memory): its history is lost. Raised by ``record_answer``, and by
    ``optimize`` when ``PilotConfig.on_history_lost == "raise"``; ``end_conversation``
    acknowledges the loss, after which the id starts a new conversation."""


class ConversationStateError(ContextPilotError, ValueError):
    """The conversation is not in a state that allows the call (for example an
    answer recorded twice for the same turn)."""


class DuplicateRequestError(ContextPilotError, ValueError):
    """A request id is already present in the context index."""


class NoReplicaAvailableError(ContextPilotError, RuntimeError):
    """No healthy replica exists to route a request to."""


class InvalidRouteRequestError(ContextPilotError, ValueError):
    """A routing request is malformed: negative token counts, a block size below one,
    or a boundary outside ``1..len(block_hashes)``."""


class InvalidDecisionError(ContextPilotError, ValueError):
    """A policy chose a replica that does not exist, is unhealthy, serves another
    model, or was excluded for the request although another replica was available."""


class RoutingError(ContextPilotError, RuntimeError):
    """A routed request got no answer: every attempt failed, its ``deadline_s`` passed,
    or a resumed stream diverged from the text already delivered. ``attempts``: the
    failed tries (:class:`~contextpilot_rag.routing.client.Attempt`), oldest first."""

    def __init__(self, message: str, attempts: Sequence[Attempt] = ()) -> None:
        super().__init__(message)
        self.attempts = tuple(attempts)


class EndpointError(ContextPilotError, RuntimeError):
    """An endpoint rejected the request itself (an HTTP 4xx other than 401, 403, 404
    and 429, which are the endpoint's faults and tried elsewhere): the caller's error,
    not retried elsewhere. ``status``: the HTTP status; ``reason``: the start of the
    endpoint's answer, credentials scrubbed, without the endpoint's URL (what a proxy
    may pass on to its client)."""

    def __init__(self, message: str, status: int, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class ProviderError(ContextPilotError, RuntimeError):
    """A hosted provider's API failed a request the live cloud benchmark
    (``bench --suite cloud --live``) sent, or the run spent more than its budget; the
    SDK's error, if any, is the ``__cause__``."""


class StoreError(ContextPilotError, RuntimeError):
    """A state store (a SQLite file, a Redis server) failed the call."""


class StoreUnavailableError(StoreError):
    """The store cannot be reached now: refused, timed out, locked past its busy
    timeout, or closed. Raised within the store's timeouts, never after a hang.

    The call changed nothing in this process. Every write the store acknowledged
    before is kept; only the write of the failed call itself can be lost, and one
    whose reply was lost to a timeout may still have been applied (a turn then shows
    in the history, awaiting its answer). Call again once the store is back."""


class StoreFormatError(StoreError):
    """A stored record (or the store's schema) is in a format this version of
    contextpilot_rag cannot read: written by a newer version, or damaged."""


class ConversationConflictError(ContextPilotError, RuntimeError):
    """Other writers (processes, or pilots sharing the store) kept changing the
    conversation while this call planned its turn, through every re-plan it was
    allowed. Nothing was written; calling again is safe."""
