"""contextpilot-rag for LlamaIndex: an LLM that routes every request over a fleet of
OpenAI-compatible engines, so prompts that share a prefix meet the engine caching it;
and the pilot's prompt as chat messages with Anthropic cache points
(:func:`prompt_to_chat_messages`, for ``llama_index.llms.anthropic.Anthropic``).

>>> from llama_index.llms.contextpilot import ContextPilotLLM
>>> llm = ContextPilotLLM(endpoints=["http://10.0.0.1:8000/v1"], model="qwen")  # doctest: +SKIP
>>> # Settings.llm = llm; index.as_query_engine(streaming=True)
"""

from llama_index.llms.contextpilot._cached_messages import prompt_to_chat_messages
from llama_index.llms.contextpilot.base import ContextPilotLLM

__all__ = ["ContextPilotLLM", "prompt_to_chat_messages"]
