"""Wrappers that run a mem0 memory's search results through a :class:`ContextPilot`.

``search`` calls the wrapped memory's own ``search`` with every argument unchanged,
then returns a copy of mem0's response whose ``results`` are reordered for prefix
reuse and annotated. Every other attribute is the wrapped memory's own. mem0 itself
is never imported here: anything with mem0's ``search`` contract can be wrapped
(``Memory``, ``MemoryClient``, their async twins). A dedup conversation is kept under
the tenant of its searches' mem0 scope (:mod:`._scope`).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec

from contextpilot_rag import ConfigError, ContextPilot, InvalidInputError, Prompt

from ._results import read_response, rebuild_response
from ._scope import scope_tenant

__all__ = ["AsyncContextPilotMemory", "ContextPilotMemory"]

_P = ParamSpec("_P")


@dataclass(frozen=True)
class _Conversation:
    """A search's dedup conversation: its id, under the tenant of the search's scope."""

    id: str
    tenant: str


class _PilotMemory:
    """What both wrappers share: construction checks, the optimization of one
    response, and attribute pass-through. State: the wrapped memory and the pilot
    (thread-safe), nothing else."""

    _async_search = False

    def __init__(
        self, memory: Any, pilot: ContextPilot | None = None, *, dedup: bool = False
    ) -> None:
        _check_search(memory, is_async=self._async_search)
        if pilot is not None and not isinstance(pilot, ContextPilot):
            raise InvalidInputError(f"pilot must be a ContextPilot, got {type(pilot).__name__}")
        if not isinstance(dedup, bool):
            raise InvalidInputError(f"dedup must be a bool, got {dedup!r}")
        pilot = pilot if pilot is not None else ContextPilot()
        if dedup and not pilot.config.dedup:
            raise ConfigError("dedup=True needs a pilot whose PilotConfig.dedup is True")
        self._memory = memory
        self.pilot: ContextPilot = pilot
        self.dedup = dedup

    @property
    def memory(self) -> Any:
        """The wrapped mem0 memory."""
        return self._memory

    def record_answer(
        self,
        prompt: Prompt | str,
        text: str,
        *,
        request_id: str | None = None,
        filters: Mapping[str, Any] | None = None,
    ) -> None:
        """Record ``text`` as the answer to a search's turn (dedup mode): the next
        search's ``messages`` carry it as history.

        ``prompt`` is the conversation id, with ``filters`` the search's own (its
        ``user_id``/``agent_id``/``run_id`` name the conversation's scope; without them
        :class:`~contextpilot_rag.errors.InvalidInputError`) and ``request_id`` the
        search's ``found["contextpilot"]["request_id"]`` (the pairing is then exact,
        whatever else ran on the conversation meanwhile), or a :class:`Prompt`. A
        conversation id without ``request_id`` answers the one turn awaiting an answer
        and is refused (:class:`~contextpilot_rag.errors.ConversationStateError`) when
        several await one. See :meth:`ContextPilot.record_answer`."""
        if filters is None and not isinstance(prompt, Prompt):
            raise InvalidInputError(
                "record_answer needs the filters= of the search it answers: a conversation "
                "belongs to its user_id, agent_id or run_id"
            )
        tenant = None if filters is None else scope_tenant(filters)
        self.pilot.record_answer(prompt, text, request_id=request_id, tenant=tenant)

    def _conversation(
        self, conversation_id: str | None, session_id: str | None, search: Mapping[str, Any]
    ) -> _Conversation | None:
        """Before mem0 is called: the conversation of a search with arguments
        ``search``, which only means something with dedup."""
        conversation_id = _named_conversation(conversation_id, session_id)
        if conversation_id is None:
            return None
        if not self.dedup:
            raise InvalidInputError(
                "conversation_id is used only for de-duplication, which is off: construct "
                f"{type(self).__name__}(..., dedup=True) and send the returned messages "
                "(see the dedup section of docs/integrations/mem0.md)"
            )
        if not isinstance(conversation_id, str) or not conversation_id:
            raise InvalidInputError(
                f"conversation_id must be a non-empty str, got {conversation_id!r}"
            )
        return _Conversation(conversation_id, scope_tenant(search.get("filters")))

    def _optimize(
        self, response: object, query: str, conversation: _Conversation | None
    ) -> dict[str, Any]:
        read = read_response(response)
        conversation_id = None if conversation is None else conversation.id
        tenant = None if conversation is None else conversation.tenant
        # a conversation's turn without memories still enters its history
        prompt = (
            self.pilot.optimize(read.blocks, query, conversation_id=conversation_id, tenant=tenant)
            if read.blocks or conversation_id is not None
            else None
        )
        return rebuild_response(read, prompt, conversation_id=conversation_id, tenant=tenant)

    def __getattr__(self, name: str) -> Any:
        if name == "_memory" or name.startswith("__"):  # not set yet (copy, unpickling)
            raise AttributeError(name)
        return getattr(self._memory, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(self._memory)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._memory!r}, dedup={self.dedup})"


def _named_conversation(conversation_id: str | None, session_id: str | None) -> str | None:
    """The conversation id given as ``conversation_id`` or as its alias ``session_id``
    (the name LangChain's and LlamaIndex's chat histories use)."""
    if session_id is None:
        return conversation_id
    if conversation_id is not None and conversation_id != session_id:
        raise ConfigError(
            f"conversation_id={conversation_id!r} and its alias session_id={session_id!r} "
            "differ: pass one of them"
        )
    return session_id


def _check_search(memory: object, *, is_async: bool) -> None:
    """``memory`` has a ``search`` method, async exactly when the wrapper is."""
    search = getattr(memory, "search", None)
    name = type(memory).__name__
    if not callable(search):
        raise InvalidInputError(
            f"expected a mem0 Memory (anything with a search() method), got {name}"
        )
    if inspect.iscoroutinefunction(search) and not is_async:
        raise InvalidInputError(f"{name}.search is async; wrap it with AsyncContextPilotMemory")
    if is_async and not inspect.iscoroutinefunction(search):
        raise InvalidInputError(f"{name}.search is not async; wrap it with ContextPilotMemory")


def _in_a_thread(method: Callable[_P, None], doc: str) -> Callable[_P, Awaitable[None]]:
    """The coroutine function that runs ``method`` in a worker thread (its signature)."""

    @functools.wraps(method)
    async def in_a_thread(*args: _P.args, **kwargs: _P.kwargs) -> None:
        await asyncio.to_thread(method, *args, **kwargs)

    in_a_thread.__name__ = in_a_thread.__qualname__ = f"a{method.__name__}"
    in_a_thread.__doc__ = doc
    return in_a_thread


class ContextPilotMemory(_PilotMemory):
    """A mem0 ``Memory`` whose ``search`` results come back in prefix-sharing order.

    ``ContextPilotMemory(memory, pilot=None, *, dedup=False)``: ``pilot`` defaults to a
    new ``ContextPilot()``; share one pilot per process (and per engine). ``dedup``
    (off by default) lets ``search(..., conversation_id=...)`` replace memories already
    sent in that conversation by a note; it is safe only when the application sends
    the returned ``messages`` (see ``docs/integrations/mem0.md``). A conversation
    belongs to the ``user_id``/``agent_id``/``run_id`` of its searches' ``filters``:
    another scope with the same ``conversation_id`` has a conversation of its own.
    """

    def search(
        self,
        query: str,
        *,
        conversation_id: str | None = None,
        session_id: str | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """``memory.search(query, **kwargs)`` (mem0's own arguments: ``filters=``,
        ``top_k=``, ``threshold=``, ``rerank=``, ...; ``conversation_id`` and its alias
        ``session_id`` are never passed on), its ``results`` reordered and annotated.
        Both given with different values: :class:`~contextpilot_rag.errors.ConfigError`,
        before mem0 is called.

        Returns mem0's response with every top-level key kept, ``results`` holding the
        same memories (copies, each with ``"contextpilot": {"rank", "moved", "status",
        "label"}``) and ``"contextpilot"`` at the top level: ``request_id``,
        ``order_note``, ``location_note``, ``notes``, ``messages``, ``stats``,
        ``conversation_id``, ``tenant`` (the pilot tenant the conversation is kept
        under). A ``conversation_id`` whose ``filters`` name no ``user_id``,
        ``agent_id`` or ``run_id``: :class:`~contextpilot_rag.errors.InvalidInputError`,
        before mem0 is called. An exception from mem0 propagates and nothing is stored.
        """
        conversation = self._conversation(conversation_id, session_id, kwargs)
        response = self._memory.search(query, **kwargs)
        return self._optimize(response, query, conversation)


class AsyncContextPilotMemory(_PilotMemory):
    """:class:`ContextPilotMemory` for mem0's ``AsyncMemory`` (or ``AsyncMemoryClient``):
    ``await search(...)``, ``await arecord_answer(...)``; pass-through attributes are
    the async memory's own. The pilot runs in a worker thread, off the event loop (it
    tokenizes new memories, and a shared store is a blocking round trip)."""

    _async_search = True

    async def search(
        self,
        query: str,
        *,
        conversation_id: str | None = None,
        session_id: str | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """``await memory.search(query, **kwargs)``, reordered and annotated exactly as
        :meth:`ContextPilotMemory.search` does."""
        conversation = self._conversation(conversation_id, session_id, kwargs)
        response = await self._memory.search(query, **kwargs)
        return await asyncio.to_thread(self._optimize, response, query, conversation)

    arecord_answer = _in_a_thread(
        _PilotMemory.record_answer,
        "``await arecord_answer(...)``: :meth:`record_answer` (same arguments) in a worker "
        "thread, off the event loop (a shared store is a blocking round trip); the "
        "synchronous ``record_answer`` still works.",
    )
