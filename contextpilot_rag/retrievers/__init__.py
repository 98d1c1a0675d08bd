"""Built-in retrievers for examples and benchmarks.

Each returns :class:`~contextpilot_rag.ContextBlock` s with ``score`` set, best first,
ready for :meth:`ContextPilot.optimize`:

>>> from contextpilot_rag.retrievers import BM25Retriever
>>> retriever = BM25Retriever(["Paris is in France.", "Rome is in Italy."])
>>> [block.text for block in retriever.retrieve("where is paris", k=1)]
['Paris is in France.']

:class:`BM25Retriever` needs ``pip install "contextpilot-rag[bm25]"`` and
:class:`FaissRetriever` ``pip install "contextpilot-rag[faiss]"``; both are imported
when a retriever is built, so this package imports without them.
"""

from .base import Retriever
from .bm25 import BM25Retriever
from .faiss_flat import EmbedFn, FaissRetriever, Metric
from .hashing import HashingEmbedder

__all__ = ["BM25Retriever", "EmbedFn", "FaissRetriever", "HashingEmbedder", "Metric", "Retriever"]
