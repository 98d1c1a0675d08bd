"""The LlamaIndex path of the real-engine benchmark: a query engine the way LlamaIndex
users build one — a retriever, a ``RetrieverQueryEngine`` streaming through
``OpenAILike`` against the engine — once plain and once with
:class:`llama_index.postprocessor.contextpilot.ContextPilotNodePostprocessor` in its
``node_postprocessors`` and the ``ContextPilotEventHandler`` attached, so the pilot
learns what the engine cached.

The frameworks are optional: this module imports them only when a query engine is
built (``pip install llama-index-llms-openai-like`` and the
``llama-index-postprocessor-contextpilot`` integration). The core never imports it.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ConfigError
from ..pilot import ContextPilot
from ..usage import CacheUsage, parse_cache_usage
from .engine_suite import ArmRun, EngineTarget, Sent, reset_cache
from .engine_workloads import SYSTEM, EngineRequest

__all__ = ["llamaindex_available", "run_llamaindex_arm"]

_MODULES = (
    "llama_index.core",
    "llama_index.llms.openai_like",
    "llama_index.postprocessor.contextpilot",
)


def llamaindex_available() -> bool:
    """Whether LlamaIndex, its ``OpenAILike`` LLM and the integration import."""
    try:
        for module in _MODULES:
            importlib.import_module(module)
    except ImportError:
        return False
    return True


def _query_engine(
    engine: EngineTarget,
    postprocessors: list[Any],
    max_tokens: int,
    context_window: int,
) -> tuple[Any, Callable[[EngineRequest], None]]:
    """The query engine, and the function that hands it a request's retrieved
    passages (the retriever returns what the benchmark's BM25 retrieved for it)."""
    from llama_index.core.base.llms.types import ChatMessage, MessageRole
    from llama_index.core.prompts import ChatPromptTemplate
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.llms.openai_like import OpenAILike  # type: ignore[import-untyped]

    class _Retrieved(BaseRetriever):
        """Returns the passages of the request being sent, best first."""

        def __init__(self) -> None:
            super().__init__()
            self.nodes: list[NodeWithScore] = []

        def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            return list(self.nodes)

    retriever = _Retrieved()

    def hand(request: EngineRequest) -> None:
        count = len(request.blocks)
        retriever.nodes = [
            NodeWithScore(node=TextNode(text=block.text, id_=block.id), score=float(count - rank))
            for rank, block in enumerate(request.blocks)
        ]

    template = ChatPromptTemplate(
        message_templates=[
            ChatMessage(role=MessageRole.SYSTEM, content=SYSTEM),
            ChatMessage(
                role=MessageRole.USER, content="Context:\n\n{context_str}\n\nQuestion: {query_str}"
            ),
        ]
    )
    llm = OpenAILike(
        model=engine.model_name,
        api_base=engine.base_url,
        api_key="unused",
        is_chat_model=True,
        context_window=context_window,
        max_tokens=max_tokens,
        temperature=0.0,
        additional_kwargs={"stream_options": {"include_usage": True}},
    )
    query_engine = RetrieverQueryEngine.from_args(
        retriever,
        llm=llm,
        node_postprocessors=postprocessors,
        text_qa_template=template,
        streaming=True,
    )
    return query_engine, hand


class _UsageLog:
    """Records the usage of every LLM call LlamaIndex reports (its instrumentation's
    chat end events), attached to the root dispatcher while an arm runs."""

    def __init__(self) -> None:
        from llama_index.core.instrumentation.event_handlers import BaseEventHandler
        from llama_index.core.instrumentation.events.llm import LLMChatEndEvent

        reports: list[CacheUsage] = []

        class _Handler(BaseEventHandler):
            @classmethod
            def class_name(cls) -> str:
                return "ContextPilotBenchUsageLog"

            def handle(self, event: Any, **kwargs: Any) -> None:
                if isinstance(event, LLMChatEndEvent) and event.response is not None:
                    reports.append(parse_cache_usage(event.response))

        self.reports = reports
        self.handler = _Handler()

    def take(self) -> CacheUsage:
        """The one report since the last call: :class:`ConfigError` unless the query made
        exactly one LLM call (a context window smaller than the prompt makes LlamaIndex
        split the passages over several)."""
        reports = list(self.reports)
        self.reports.clear()
        if len(reports) != 1:
            raise ConfigError(
                f"expected one LLM call per query, saw {len(reports)}: give context_window "
                "the engine's maximum model length"
            )
        return reports[0]


def _send(query_engine: Any, log: _UsageLog, request: EngineRequest) -> Sent:
    started = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    response = query_engine.query(request.question)
    for delta in response.response_gen:
        if first is None:
            first = time.perf_counter()
        parts.append(delta)
    ended = time.perf_counter()
    return Sent.timed(started, first, ended, log.take(), "".join(parts))


def run_llamaindex_arm(
    name: str,
    engine: EngineTarget,
    requests: Sequence[EngineRequest],
    *,
    pilot: ContextPilot | None,
    max_tokens: int = 1,
    context_window: int = 8192,
    tick: Callable[[], None] | None = None,
) -> tuple[ArmRun, Any]:
    """Send every request through the query engine, one at a time in the given order
    (plain when ``pilot`` is ``None``), on a reset cache; returns the arm and the
    ``ContextPilotEventHandler`` that was attached (``None`` for the plain arm).
    ``context_window``: the engine's maximum model length (so LlamaIndex sends each
    query's passages in one call)."""
    from llama_index_instrumentation import get_dispatcher

    integration = importlib.import_module("llama_index.postprocessor.contextpilot")
    postprocessors = (
        [] if pilot is None else [integration.ContextPilotNodePostprocessor(pilot=pilot)]
    )
    query_engine, hand = _query_engine(engine, postprocessors, max_tokens, context_window)
    dispatcher = get_dispatcher()
    log = _UsageLog()
    feedback = None if pilot is None else integration.ContextPilotEventHandler(pilot)
    reset = reset_cache(engine)
    dispatcher.add_event_handler(log.handler)
    if feedback is not None:
        feedback.attach(dispatcher)
    try:
        sent = []
        for request in requests:
            hand(request)
            sent.append(_send(query_engine, log, request))
            if tick is not None:
                tick()
    finally:
        dispatcher.event_handlers = [h for h in dispatcher.event_handlers if h is not log.handler]
        if feedback is not None:
            feedback.detach(dispatcher)
    return ArmRun(name, tuple(sent), reset), feedback
