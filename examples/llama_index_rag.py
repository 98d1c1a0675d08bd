"""LlamaIndex RAG with ContextPilot, fully offline.

A ``VectorStoreIndex`` (with the core's offline hashing embedder as its embedding
model) retrieves overlapping documents in a different order for each question.
``ContextPilotNodePostprocessor`` reorders them so that prompts share a prefix; the
query engine asks ``OpenAILike``, which talks to the loopback OpenAI-compatible test
server. That server models an engine's prefix cache and reports ``cached_tokens``
like vLLM or OpenAI do. The same questions through a plain query engine show what an
application without the pilot gets.

Needs ``pip install llama-index-postprocessor-contextpilot llama-index-llms-openai-like``.
Run: ``python examples/llama_index_rag.py``
"""

from __future__ import annotations

from collections.abc import Sequence

from llama_index.core import VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, TextNode
from llama_index.llms.openai_like import OpenAILike  # type: ignore[import-untyped]
from llama_index.postprocessor.contextpilot import (
    LABEL_KEY,
    NOTES_KEY,
    RANK_KEY,
    ContextPilotNodePostprocessor,
)

from contextpilot_rag import ContextPilot
from contextpilot_rag.retrievers import HashingEmbedder
from contextpilot_rag.testing import OpenAICompatibleServer
from contextpilot_rag.testing.samples import SAMPLE_CORPUS as CORPUS
from contextpilot_rag.testing.samples import SAMPLE_QUESTIONS as QUESTIONS


class HashingEmbedding(BaseEmbedding):
    """The core's offline hashing embedder as a LlamaIndex embedding model (lexical,
    not semantic: fine for an example, use a real embedding model in production)."""

    def _embed(self, text: str) -> list[float]:
        return [float(x) for x in HashingEmbedder(dim=256)([text])[0]]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._embed(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._embed(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._embed(text)


def build_index() -> VectorStoreIndex:
    nodes = [TextNode(id_=doc_id, text=text) for doc_id, text in CORPUS.items()]
    return VectorStoreIndex(nodes, embed_model=HashingEmbedding())


def ask_all(
    index: VectorStoreIndex, postprocessors: list[BaseNodePostprocessor], *, show: bool
) -> int:
    """Run every question through a fresh engine; return its cached prompt tokens."""
    with OpenAICompatibleServer(model="test-model") as server:
        llm = OpenAILike(
            api_base=server.base_url,
            api_key="offline",
            model="test-model",
            is_chat_model=True,
            context_window=8192,
            max_retries=0,
        )
        engine = index.as_query_engine(
            llm=llm, similarity_top_k=4, node_postprocessors=postprocessors
        )
        for question in QUESTIONS:
            cached_before = server.cache.cached_tokens_total
            response = engine.query(question)
            if show:
                _show(
                    question,
                    response.source_nodes,
                    server.cache.cached_tokens_total - cached_before,
                )
        return server.cache.cached_tokens_total


def _show(question: str, nodes: Sequence[NodeWithScore], cached: int) -> None:
    by_rank = sorted(nodes, key=lambda item: item.node.metadata[RANK_KEY])
    print(f"{question}\n  retrieved {[item.node.metadata[LABEL_KEY] for item in by_rank]}")
    print(
        f"  sent      {[item.node.metadata[LABEL_KEY] for item in nodes]}, cached tokens {cached}"
    )
    if nodes[0].node.metadata[NOTES_KEY]:
        print(f"  note      {nodes[0].node.metadata[NOTES_KEY]}")


def main() -> dict[str, int]:
    index = build_index()
    postprocessor = ContextPilotNodePostprocessor(pilot=ContextPilot())  # one per process
    cached = {
        "contextpilot": ask_all(index, [postprocessor], show=True),
        "unmodified": ask_all(index, [], show=False),
    }
    print("\ncached tokens over all questions: " + ", ".join(f"{k} {v}" for k, v in cached.items()))
    return cached


if __name__ == "__main__":
    main()
