"""The LangChain path of the real-engine benchmark and of the demo: a RAG chain the
way LangChain users write it — a retriever, ``format_documents``, a
``ChatPromptTemplate`` and ``ChatOpenAI`` against the engine — once plain and once
through :class:`langchain_contextpilot.ContextPilotRetriever` with the
``ContextPilotCallbackHandler`` attached, so the pilot learns what the engine cached.

The frameworks are optional: this module imports them only when a chain is built
(``pip install langchain-openai`` and the ``langchain-contextpilot`` integration).
The core never imports it.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..pilot import ContextPilot
from ..usage import parse_cache_usage
from .engine_suite import ArmRun, EngineTarget, Sent, reset_cache
from .engine_workloads import SYSTEM, EngineRequest

__all__ = ["langchain_available", "run_langchain_arm"]


def langchain_available() -> bool:
    """Whether ``langchain_openai`` and ``langchain_contextpilot`` import."""
    try:
        for module in ("langchain_contextpilot", "langchain_openai"):
            importlib.import_module(module)
    except ImportError:
        return False
    return True


def _chain(
    engine: EngineTarget,
    requests: Sequence[EngineRequest],
    pilot: ContextPilot | None,
    max_tokens: int,
) -> tuple[Any, list[Any]]:
    integration = importlib.import_module("langchain_contextpilot")
    from langchain_core.documents import Document
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableLambda
    from langchain_openai import ChatOpenAI

    documents = {
        r.query: [Document(page_content=b.text, id=b.id) for b in r.blocks] for r in requests
    }
    base: Any = RunnableLambda(lambda query: documents[query])
    if pilot is None:
        retriever: Any = base
        template = ChatPromptTemplate.from_messages(
            [("system", SYSTEM + "\n\nContext:\n\n{context}"), ("human", "{question}")]
        )

        def context(docs: list[Any]) -> str:
            return "\n\n".join(doc.page_content for doc in docs)

        handlers: list[Any] = []
    else:
        retriever = integration.ContextPilotRetriever(base_retriever=base, pilot=pilot)
        header = pilot.config.context_header
        question = pilot.config.question_template.replace("{query}", "{question}")
        template = ChatPromptTemplate.from_messages(
            [("system", SYSTEM), ("human", header + "{context}" + question)]
        )

        def context(docs: list[Any]) -> str:
            return str(integration.format_documents(docs, pilot=pilot))

        handlers = [integration.ContextPilotCallbackHandler(pilot)]
    llm = ChatOpenAI(
        base_url=engine.base_url,
        model=engine.model_name,
        api_key="unused",  # type: ignore[arg-type]
        max_completion_tokens=max_tokens,
        temperature=0.0,
        stream_usage=True,
    )
    chain = (
        {
            "context": (lambda x: x["query"]) | retriever | RunnableLambda(context),
            "question": lambda x: x["question"],
        }
        | template
        | llm
    )
    return chain, handlers


def _send(chain: Any, handlers: list[Any], request: EngineRequest) -> Sent:
    config: dict[str, Any] = {"callbacks": handlers}
    started = time.perf_counter()
    first: float | None = None
    message: Any = None
    for chunk in chain.stream({"query": request.query, "question": request.question}, config):
        if first is None and (chunk.content or chunk.response_metadata.get("finish_reason")):
            first = time.perf_counter()
        message = chunk if message is None else message + chunk
    ended = time.perf_counter()
    return Sent.timed(started, first, ended, parse_cache_usage(message), str(message.content))


def run_langchain_arm(
    name: str,
    engine: EngineTarget,
    requests: Sequence[EngineRequest],
    *,
    pilot: ContextPilot | None,
    max_tokens: int = 1,
    concurrent: bool = False,
    tick: Callable[[], None] | None = None,
) -> tuple[ArmRun, list[Any]]:
    """Stream every request through the chain (plain when ``pilot`` is ``None``) on a
    reset cache; returns the arm (requests in the given order) and the callback
    handlers it attached. ``concurrent``: each session's requests run in order on a
    thread of their own, all sessions at once (several users); otherwise one at a
    time in the given order."""
    chain, handlers = _chain(engine, requests, pilot, max_tokens)
    reset = reset_cache(engine)
    results: dict[int, Sent] = {}

    def serve(numbers: Sequence[int]) -> None:
        for number in numbers:
            results[number] = _send(chain, handlers, requests[number])
            if tick is not None:
                tick()

    if concurrent:
        sessions: dict[str | None, list[int]] = {}
        for number, request in enumerate(requests):
            sessions.setdefault(request.session, []).append(number)
        with ThreadPoolExecutor(max_workers=len(sessions)) as pool:
            for done in [pool.submit(serve, numbers) for numbers in sessions.values()]:
                done.result()
    else:
        serve(range(len(requests)))
    sent = tuple(results[number] for number in range(len(requests)))
    return ArmRun(name, sent, reset), handlers
