"""Helpers for tests and examples: an OpenAI-compatible server on loopback that models
an inference engine's prefix cache (:class:`OpenAICompatibleServer`), real
``llama-server`` processes when the engine is built (:class:`LlamaServer`), real
``redis-server`` processes for the shared stores (:class:`RedisServer`), a chat
endpoint that streams a fixed script of deltas (:class:`ScriptedChatServer`), an
emulator of the Anthropic Messages and OpenAI Chat Completions APIs with their published
prompt-cache rules (:class:`CloudCacheServer`) and a small sample corpus. Nothing here is
imported by the core package.
"""

from .cloud_server import CloudCacheServer, EmulatedRequest
from .llama_server import LlamaEngine, LlamaServer, find_llama_server
from .openai_server import OWNED_BY, OpenAICompatibleServer, ReplyFunction, default_reply
from .redis_server import RedisServer, find_redis_server
from .samples import SAMPLE_CORPUS, SAMPLE_QUESTIONS
from .scripted_server import ScriptedChatServer

__all__ = [
    "OWNED_BY",
    "SAMPLE_CORPUS",
    "SAMPLE_QUESTIONS",
    "CloudCacheServer",
    "EmulatedRequest",
    "LlamaEngine",
    "LlamaServer",
    "OpenAICompatibleServer",
    "RedisServer",
    "ReplyFunction",
    "ScriptedChatServer",
    "default_reply",
    "find_llama_server",
    "find_redis_server",
]
