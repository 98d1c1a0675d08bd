"""Helpers for tests and examples: an OpenAI-compatible server on loopback that models
an inference engine's prefix cache (:class:`OpenAICompatibleServer`), and a small
sample corpus.

Standard library only; nothing here is imported by the core package.
"""

from .openai_server import OWNED_BY, OpenAICompatibleServer, ReplyFunction, default_reply
from .samples import SAMPLE_CORPUS, SAMPLE_QUESTIONS

__all__ = [
    "OWNED_BY",
    "SAMPLE_CORPUS",
    "SAMPLE_QUESTIONS",
    "OpenAICompatibleServer",
    "ReplyFunction",
    "default_reply",
]
