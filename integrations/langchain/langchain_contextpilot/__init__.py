"""LangChain integration of contextpilot_rag: reorder, de-duplicate and annotate
retrieved documents so inference engines reuse their prefix cache, a chat model that
routes every request over a fleet of engines, a prompt builder for hosted prompt
caches (Anthropic ``cache_control``, OpenAI ``prompt_cache_key``), and a callback
handler that reports what the engine served from its cache back to the pilot.

>>> from langchain_contextpilot import ChatContextPilot, ContextPilotRetriever, format_documents
>>> retriever = ContextPilotRetriever(base_retriever=vectorstore.as_retriever())  # doctest: +SKIP
>>> chain = retriever | format_documents  # doctest: +SKIP
>>> llm = ChatContextPilot(endpoints=["http://10.0.0.1:8000/v1"], model="qwen")  # doctest: +SKIP
>>> from langchain_contextpilot import ContextPilotCallbackHandler
>>> handler = ContextPilotCallbackHandler(retriever.pilot)  # doctest: +SKIP
>>> chain.invoke(question, config={"callbacks": [handler]})  # doctest: +SKIP
"""

from ._cached_messages import (
    MESSAGE_KEY,
    CachedPromptAnnotation,
    ContextPilotPromptBuilder,
    build_cached_messages,
    with_prompt_cache_key,
)
from ._callbacks import ContextPilotCallbackHandler
from ._chat_model import ChatContextPilot
from ._compressor import ContextPilotCompressor
from ._documents import ANNOTATION_KEY, ContextPilotAnnotation
from ._format import format_documents
from ._retriever import ContextPilotRetriever
from ._transformer import ContextPilotDocumentTransformer

__version__ = "0.1.0"

__all__ = [
    "ANNOTATION_KEY",
    "MESSAGE_KEY",
    "CachedPromptAnnotation",
    "ChatContextPilot",
    "ContextPilotAnnotation",
    "ContextPilotCallbackHandler",
    "ContextPilotCompressor",
    "ContextPilotDocumentTransformer",
    "ContextPilotPromptBuilder",
    "ContextPilotRetriever",
    "__version__",
    "build_cached_messages",
    "format_documents",
    "with_prompt_cache_key",
]
