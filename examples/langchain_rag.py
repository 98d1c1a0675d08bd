"""LangChain RAG with ContextPilot, fully offline.

A LangChain vector store (``InMemoryVectorStore`` with the core's offline hashing
embedder) retrieves overlapping documents in a different order for each question.
``ContextPilotRetriever`` reorders them so that prompts share a prefix, an LCEL chain
formats them with ``format_documents`` and asks ``ChatOpenAI``, which talks to the
loopback OpenAI-compatible test server; that server models an engine's prefix cache
and reports ``cached_tokens`` like vLLM or OpenAI do. The same questions through the
plain retriever show what an application without the pilot gets.

Needs ``pip install langchain-contextpilot langchain-openai``.
Run: ``python examples/langchain_rag.py``
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from langchain_contextpilot import ANNOTATION_KEY, ContextPilotRetriever, format_documents
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from contextpilot_rag import ContextPilot
from contextpilot_rag.retrievers import HashingEmbedder
from contextpilot_rag.testing import OpenAICompatibleServer
from contextpilot_rag.testing.samples import SAMPLE_CORPUS as CORPUS
from contextpilot_rag.testing.samples import SAMPLE_QUESTIONS as QUESTIONS

SYSTEM = "Answer the question from the context documents. Cite their labels."


class HashingEmbeddings(Embeddings):
    """The core's offline hashing embedder as a LangChain ``Embeddings`` (lexical,
    not semantic: fine for an example, use a real embedding model in production)."""

    def __init__(self) -> None:
        self._embed = HashingEmbedder(dim=256)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [[float(x) for x in row] for row in self._embed(texts)]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


def vector_store_retriever() -> BaseRetriever:
    store = InMemoryVectorStore(HashingEmbeddings())
    documents = [Document(page_content=text, id=doc_id) for doc_id, text in CORPUS.items()]
    store.add_documents(documents)
    return store.as_retriever(search_kwargs={"k": 4})


def rag_chain(retriever: Runnable[str, list[Document]], base_url: str) -> Runnable[Any, Any]:
    """question → {question, documents, context, answer}."""
    prompt = ChatPromptTemplate.from_messages(
        [("system", SYSTEM), ("human", "Context documents:\n\n{context}Question: {question}")]
    )
    llm = ChatOpenAI(
        base_url=base_url, api_key=SecretStr("offline"), model="test-model", max_retries=0
    )
    return (
        RunnablePassthrough.assign(documents=itemgetter("question") | retriever)
        .assign(context=lambda inputs: format_documents(inputs["documents"]))
        .assign(answer=prompt | llm)
    )


def ask_all(retriever: Runnable[str, list[Document]], *, show: bool) -> int:
    """Run every question through a fresh engine; return the cached prompt tokens."""
    total = 0
    with OpenAICompatibleServer(model="test-model") as server:
        chain = rag_chain(retriever, server.base_url)
        for question in QUESTIONS:
            result = chain.invoke({"question": question})
            usage = result["answer"].usage_metadata or {}
            cached = int(usage.get("input_token_details", {}).get("cache_read") or 0)
            total += cached
            if show:
                _show(question, result["documents"], cached)
    return total


def _show(question: str, documents: Sequence[Document], cached: int) -> None:
    annotations = [doc.metadata[ANNOTATION_KEY] for doc in documents]
    retrieved = [a["label"] for a in sorted(annotations, key=lambda a: a["rank"])]
    print(f"{question}\n  retrieved {retrieved}")
    print(f"  sent      {[a['label'] for a in annotations]}, cached tokens {cached}")
    if annotations[0]["order_note"]:
        print(f"  note      {annotations[0]['order_note']}")


def main() -> dict[str, int]:
    base = vector_store_retriever()
    pilot = ContextPilot()
    cached = {
        "contextpilot": ask_all(ContextPilotRetriever(base_retriever=base, pilot=pilot), show=True),
        "unmodified": ask_all(base, show=False),
    }
    print("\ncached tokens over all questions: " + ", ".join(f"{k} {v}" for k, v in cached.items()))
    return cached


if __name__ == "__main__":
    main()
