"""The engine's cache truth on the LlamaIndex path: ``ContextPilotEventHandler``, on
LlamaIndex's root dispatcher, pairs each LLM call of a real query or chat engine (a real
retriever, the ContextPilot postprocessor, ``OpenAILike`` or ``ContextPilotLLM``
against the loopback OpenAI-compatible server, whose prefix cache reports
``cached_tokens``) with the pilot prompt its nodes came from, and the pilot's index
follows what the engine really holds."""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from contextpilot_rag import ContextPilot, InvalidInputError, PilotConfig, Tokenizer
from contextpilot_rag.testing import OpenAICompatibleServer

pytest.importorskip("llama_index.core")

from llama_index.core import Settings
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.response.schema import StreamingResponse
from llama_index.core.chat_engine import CondensePlusContextChatEngine
from llama_index.core.llms import LLM, MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.llms.contextpilot import ContextPilotLLM
from llama_index.llms.openai_like import OpenAILike  # type: ignore[import-untyped]
from llama_index_instrumentation import get_dispatcher

ROOT = Path(__file__).resolve().parents[2]
try:  # installed (pip install -e integrations/llama-index)
    importlib.import_module("llama_index.postprocessor.contextpilot")
except ModuleNotFoundError:  # the checkout: a namespace portion on sys.path is enough
    sys.path.insert(0, str(ROOT / "integrations" / "llama-index"))
    importlib.invalidate_caches()

from llama_index.postprocessor.contextpilot import (  # noqa: E402
    MATCHED_KEY,
    REQUEST_ID_KEY,
    ContextPilotEventHandler,
    ContextPilotNodePostprocessor,
)

TOPICS = ["solar", "wind", "batteries", "hydro", "fission", "geothermal", "tides", "biomass"]
CORPUS = {
    f"doc-{number}": f"Document {number} is about {topic} power. "
    + f"It records facts on {topic} power that a model may need to answer. " * 16
    for number, topic in enumerate(TOPICS)
}
QUERIES = {  # overlapping retrievals, most relevant first
    "What do solar and wind cost?": ["doc-0", "doc-1", "doc-2"],
    "How do wind and solar combine with hydro?": ["doc-1", "doc-3", "doc-0", "doc-2"],
    "Solar, wind and tides?": ["doc-6", "doc-0", "doc-1"],
}


class FixedRetriever(BaseRetriever):
    """A real LlamaIndex retriever over fixed results: ``results[query]``, best first."""

    def __init__(self, results: dict[str, list[str]]) -> None:
        super().__init__()
        self.results = results

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        ids = self.results[query_bundle.query_str]
        return [
            NodeWithScore(node=TextNode(id_=doc_id, text=CORPUS[doc_id]), score=1.0 - 0.1 * rank)
            for rank, doc_id in enumerate(ids)
        ]


class RecordingPilot(ContextPilot):
    """A real pilot that also records each observation: (request id, engine's prompt
    tokens)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.observed: list[tuple[str, int]] = []

    def observe_cache(self, prompt: Any, cached_tokens: int, prompt_tokens: int, **kw: Any) -> int:
        self.observed.append((str(prompt), prompt_tokens))
        return super().observe_cache(prompt, cached_tokens, prompt_tokens, **kw)


@pytest.fixture(autouse=True, scope="module")
def offline_settings() -> Iterator[None]:
    """LlamaIndex's global defaults would reach for OpenAI: make them local."""
    saved = Settings._llm
    Settings.llm = MockLLM()
    yield
    Settings._llm = saved


@pytest.fixture
def server() -> Iterator[OpenAICompatibleServer]:
    with OpenAICompatibleServer(model="test-model") as running:
        yield running


@contextmanager
def attached(pilot: ContextPilot) -> Iterator[ContextPilotEventHandler]:
    handler = ContextPilotEventHandler(pilot).attach()
    try:
        yield handler
    finally:
        handler.detach()


def openai_like(server: OpenAICompatibleServer, **options: Any) -> OpenAILike:
    return OpenAILike(
        api_base=server.base_url,
        api_key="test",
        model="test-model",
        is_chat_model=True,
        context_window=8192,
        max_retries=0,
        timeout=10.0,
        **options,
    )


def query_engine(
    pilot: ContextPilot, llm: LLM, results: dict[str, list[str]] = QUERIES, **options: Any
) -> RetrieverQueryEngine:
    return RetrieverQueryEngine.from_args(
        FixedRetriever(results),
        llm=llm,
        node_postprocessors=[ContextPilotNodePostprocessor(pilot=pilot)],
        **options,
    )


def streamed_text(response: object) -> str:
    assert isinstance(response, StreamingResponse) and response.response_gen is not None
    return "".join(response.response_gen)


# -- query engines ------------------------------------------------------------------------


def test_each_answer_of_a_query_engine_is_observed_under_its_request_id(
    pilot: ContextPilot, server: OpenAICompatibleServer
) -> None:
    engine = query_engine(pilot, openai_like(server))
    with attached(pilot) as handler:
        responses = [engine.query(query) for query in QUERIES]

    assert all(str(response).startswith("Answer from") for response in responses)
    counts = handler.counts
    assert (counts.observed, counts.unmatched, counts.no_usage, counts.evicted) == (3, 0, 0, 0)
    assert pilot.index_stats().requests == 3


def test_a_prefix_the_engine_lost_is_evicted_and_stops_steering_reorders(
    tokenizer: Tokenizer, server: OpenAICompatibleServer
) -> None:
    observed, blind = ContextPilot(tokenizer=tokenizer), ContextPilot(tokenizer=tokenizer)
    results = {"first": ["doc-0", "doc-1", "doc-2"], "second": ["doc-1", "doc-0", "doc-3"]}
    engine = query_engine(observed, openai_like(server), results)
    with attached(observed) as handler:
        engine.query("first")
        matched_nodes(blind, results["first"])
        server.cache.reset()  # the engine evicts everything it held
        engine.query("second")  # predicted doc-0, doc-1 cached: none was
        matched_nodes(blind, results["second"])

    assert handler.counts.observed == 2 and handler.counts.evicted == 1
    assert observed.index_stats().requests == 1 and blind.index_stats().requests == 2
    again = ["doc-2", "doc-1", "doc-0"]
    assert matched_nodes(blind, again) == 3  # steered by "first", which the engine lost
    assert matched_nodes(observed, again) == 2  # only by "second", which it holds


def matched_nodes(pilot: ContextPilot, ids: list[str]) -> int:
    """How many nodes a postprocessing through ``pilot`` marks as a cached prefix."""
    nodes = FixedRetriever({"q": ids}).retrieve("q")
    out = ContextPilotNodePostprocessor(pilot=pilot).postprocess_nodes(nodes, QueryBundle("q"))
    return sum(bool(item.node.metadata[MATCHED_KEY]) for item in out)


def test_concurrent_async_queries_are_each_paired_with_their_own_prompt(
    tokenizer: Tokenizer, server: OpenAICompatibleServer
) -> None:
    pilot = RecordingPilot(tokenizer=tokenizer)
    ids = list(CORPUS)
    results = {f"question {n}": ids[:n] for n in range(1, 8)}  # n nodes each
    engine = query_engine(pilot, openai_like(server), results)

    async def ask_all() -> list[Any]:
        return await asyncio.gather(*(engine.aquery(query) for query in results))

    with attached(pilot) as handler:
        responses = asyncio.run(ask_all())
    assert handler.counts.observed == 7 and handler.counts.unmatched == 0
    nodes_of = {
        response.source_nodes[0].node.metadata[REQUEST_ID_KEY]: len(response.source_nodes)
        for response in responses
    }
    # the engine's prompt grows with the nodes: each report went to its own prompt
    by_nodes = sorted(pilot.observed, key=lambda seen: nodes_of[seen[0]])
    assert [tokens for _, tokens in by_nodes] == sorted(tokens for _, tokens in pilot.observed)


def test_a_streamed_answer_is_observed_when_the_engine_streams_usage(
    pilot: ContextPilot, server: OpenAICompatibleServer
) -> None:
    with_usage = openai_like(server, additional_kwargs={"stream_options": {"include_usage": True}})
    first, second, _ = QUERIES
    with attached(pilot) as handler:
        streamed = query_engine(pilot, with_usage, streaming=True).query(first)
        assert streamed_text(streamed).startswith("Answer from")
        assert handler.counts.observed == 1
        plain = query_engine(pilot, openai_like(server), streaming=True).query(second)
        assert streamed_text(plain).startswith("Answer from")
    assert (handler.counts.observed, handler.counts.no_usage) == (1, 1)


def test_context_pilot_llm_answers_are_observed_too(
    pilot: ContextPilot, server: OpenAICompatibleServer
) -> None:
    llm = ContextPilotLLM(endpoints=[server.base_url], model="test-model")
    try:
        with attached(pilot) as handler:
            for query in QUERIES:
                query_engine(pilot, llm).query(query)
            streamed = query_engine(pilot, llm, streaming=True).query(next(iter(QUERIES)))
            assert streamed_text(streamed)
    finally:
        llm.close()
    assert (handler.counts.observed, handler.counts.unmatched, handler.counts.no_usage) == (4, 0, 0)


# -- chat engines ---------------------------------------------------------------------------


def test_a_condense_plus_context_chat_observes_each_answer_not_the_condense_step(
    pilot: ContextPilot, server: OpenAICompatibleServer
) -> None:
    results = dict(QUERIES)
    chat = CondensePlusContextChatEngine.from_defaults(
        FixedRetriever(results),
        llm=openai_like(server),
        node_postprocessors=[ContextPilotNodePostprocessor(pilot=pilot)],
    )
    first, second, _ = QUERIES
    results["Answer from 0 context documents."] = results[second]  # what the condense step asks
    with attached(pilot) as handler:
        chat.chat(first)
        chat.chat(second)  # a condense call (no nodes), then the answer
    assert len(server.requests) == 3
    assert (handler.counts.observed, handler.counts.unmatched) == (2, 1)


def test_an_llm_calling_another_of_its_methods_is_observed_once(pilot: ContextPilot) -> None:
    """MockLLM's chat calls its complete: one model call, not two."""
    chat = CondensePlusContextChatEngine.from_defaults(
        FixedRetriever(QUERIES),
        llm=MockLLM(),
        node_postprocessors=[ContextPilotNodePostprocessor(pilot=pilot)],
    )
    with attached(pilot) as handler:
        chat.chat(next(iter(QUERIES)))
    assert (handler.counts.no_usage, handler.counts.unmatched) == (1, 0)  # MockLLM: no usage


def test_a_condense_step_never_takes_a_prompt_left_over_by_another_span(
    pilot: ContextPilot,
) -> None:
    """Turn 1, then the postprocessor on its own (a sources preview), then turn 2: its
    condense call (no nodes) is ``unmatched``, not paired with the preview's prompt."""
    postprocessor = ContextPilotNodePostprocessor(pilot=pilot)
    first, second, third = QUERIES
    results = defaultdict(lambda: QUERIES[second], QUERIES)  # MockLLM's condensed question
    retriever = FixedRetriever(results)
    chat = CondensePlusContextChatEngine.from_defaults(
        retriever, llm=MockLLM(), node_postprocessors=[postprocessor]
    )
    with attached(pilot) as handler:
        chat.chat(first)
        postprocessor.postprocess_nodes(retriever.retrieve(third), QueryBundle(third))
        chat.chat(second)  # a condense call, then the answer
    assert (handler.counts.no_usage, handler.counts.unmatched) == (2, 1)  # MockLLM: no usage


# -- pairing without a shared query ---------------------------------------------------------


def test_a_postprocessing_on_its_own_pairs_with_the_next_llm_call_only_when_alone(
    pilot: ContextPilot, server: OpenAICompatibleServer
) -> None:
    postprocessor = ContextPilotNodePostprocessor(pilot=pilot)
    retriever = FixedRetriever(QUERIES)
    llm = openai_like(server)
    first, second, third = QUERIES

    def context_of(query: str) -> str:
        nodes = postprocessor.postprocess_nodes(retriever.retrieve(query), QueryBundle(query))
        return "\n\n".join(item.node.get_content() for item in nodes)

    with attached(pilot) as handler:
        llm.complete(f"{context_of(first)}\n\nQuestion: {first}")
        assert (handler.counts.observed, handler.counts.unmatched) == (1, 0)
        context_of(second)
        llm.complete(f"{context_of(third)}\n\nQuestion: {third}")  # two wait: which?
    assert (handler.counts.observed, handler.counts.unmatched) == (1, 1)


def test_without_its_span_handler_sequential_queries_are_still_paired(
    pilot: ContextPilot, server: OpenAICompatibleServer
) -> None:
    handler = ContextPilotEventHandler(pilot)
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(handler)  # the event handler alone
    try:
        engine = query_engine(pilot, openai_like(server))
        for query in QUERIES:
            engine.query(query)
    finally:
        handler.detach()
    assert (handler.counts.observed, handler.counts.unmatched) == (3, 0)


def test_prompts_of_another_pilot_are_not_this_handlers(
    tokenizer: Tokenizer, server: OpenAICompatibleServer
) -> None:
    mine, other = ContextPilot(tokenizer=tokenizer), ContextPilot(tokenizer=tokenizer)
    with attached(mine) as handler:
        query_engine(other, openai_like(server)).query(next(iter(QUERIES)))
    assert (handler.counts.observed, handler.counts.unmatched) == (0, 1)


def test_a_failed_observation_is_logged_and_counted_never_raised(
    tokenizer: Tokenizer, server: OpenAICompatibleServer, caplog: pytest.LogCaptureFixture
) -> None:
    pilot = ContextPilot(PilotConfig(max_observed_prompts=0), tokenizer=tokenizer)
    with attached(pilot) as handler, caplog.at_level(logging.WARNING):
        response = query_engine(pilot, openai_like(server)).query(next(iter(QUERIES)))
    assert str(response).startswith("Answer from")
    assert handler.counts.failed == 1 and "could not observe" in caplog.text


def test_attach_is_idempotent_and_detach_removes_both_handlers(pilot: ContextPilot) -> None:
    dispatcher = get_dispatcher()
    handler = ContextPilotEventHandler(pilot)
    before = (len(dispatcher.event_handlers), len(dispatcher.span_handlers))
    handler.attach().attach()
    assert (len(dispatcher.event_handlers), len(dispatcher.span_handlers)) == (
        before[0] + 1,
        before[1] + 1,
    )
    handler.detach()
    assert (len(dispatcher.event_handlers), len(dispatcher.span_handlers)) == before


def test_the_handler_needs_a_pilot() -> None:
    with pytest.raises(InvalidInputError, match="ContextPilot"):
        ContextPilotEventHandler("pilot")  # type: ignore[arg-type]
