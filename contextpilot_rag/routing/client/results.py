"""What a routed call returns: :class:`ChatResult` (one answer), :class:`Attempt` (one
try of a logical request), :class:`SolveResult` (answers until one is accepted), and the
streams of text deltas :class:`ChatStream` / :class:`AsyncChatStream`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from ..types import Decision

__all__ = ["AsyncChatStream", "Attempt", "ChatResult", "ChatStream", "SolveResult"]


@dataclass(frozen=True)
class ChatResult:
    """One answered request. ``endpoint`` is the base URL that answered (its
    :attr:`Endpoint.display_url`: credentials redacted); token counts
    are the engine's (``None`` when it reported none). ``ttft_s`` and ``e2e_s`` count
    from the start of the answering attempt, time the policy held it included (late
    binding: the client keeps a held request and offers it to the policy again when
    one of its prompts is prefilled, or after the policy's ``hold_s`` at the latest,
    nothing sent and no endpoint counter touched meanwhile)."""

    text: str
    endpoint: str
    model: str
    ttft_s: float
    e2e_s: float
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    decision: Decision
    attempts: int = 1
    tool_calls: tuple[dict[str, Any], ...] = ()
    """The tool calls of a chat answer, in the OpenAI format (``id``, ``type``,
    ``function.name``, ``function.arguments`` as a JSON string), streamed fragments
    joined."""


@dataclass(frozen=True)
class Attempt:
    """One try of a logical request: where (the endpoint's :attr:`~Endpoint.display_url`),
    how long, and how it ended (``error``: credentials redacted)."""

    endpoint: str
    model: str
    latency_s: float
    error: str | None = None
    correct: bool | None = None


@dataclass(frozen=True)
class SolveResult:
    """The outcome of :meth:`RoutingClient.solve`: the accepted answer (or ``None``),
    every attempt, and ``ttca_s`` — the wall time until the accepted answer (or until
    giving up)."""

    answer: ChatResult | None
    attempts: tuple[Attempt, ...]
    ttca_s: float

    @property
    def correct(self) -> bool:
        return self.answer is not None


class _Answered:
    """The answer a stream ends with: ``holder`` receives it when the last delta is
    delivered."""

    def __init__(self, holder: list[ChatResult]) -> None:
        self._holder = holder

    @property
    def result(self) -> ChatResult:
        if not self._holder:
            raise RuntimeError("the stream has not finished; iterate it to the end first")
        return self._holder[0]


class ChatStream(_Answered, Iterator[str]):
    """Text deltas of one routed request; ``result`` once exhausted. ``close()`` (or
    leaving a ``with`` block) cancels it and releases its counters."""

    def __init__(self, deltas: Iterator[str], holder: list[ChatResult]) -> None:
        super().__init__(holder)
        self._deltas = deltas

    def __iter__(self) -> ChatStream:
        return self

    def __next__(self) -> str:
        return next(self._deltas)

    def close(self) -> None:
        close = getattr(self._deltas, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> ChatStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncChatStream(_Answered):
    """Async twin of :class:`ChatStream` (``async for``; ``aclose()`` cancels)."""

    def __init__(self, deltas: AsyncIterator[str], holder: list[ChatResult]) -> None:
        super().__init__(holder)
        self._deltas = deltas

    def __aiter__(self) -> AsyncChatStream:
        return self

    async def __anext__(self) -> str:
        return await self._deltas.__anext__()

    async def aclose(self) -> None:
        aclose = getattr(self._deltas, "aclose", None)
        if aclose is not None:
            await aclose()
