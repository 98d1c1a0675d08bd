"""The pilot's prompt as LlamaIndex chat messages for Anthropic's prompt cache.

``llama-index-llms-anthropic`` sends a breakpoint (``cache_control`` on a content
block) where a message's blocks hold a :class:`~llama_index.core.llms.CachePoint`: on
the block just before it. :func:`prompt_to_chat_messages` writes the blocks and cache
points of :meth:`Prompt.to_anthropic <contextpilot_rag.Prompt.to_anthropic>`, so the
core decides where breakpoints go and this module only re-spells them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llama_index.core.base.llms.types import ContentBlock
from llama_index.core.llms import CacheControl, CachePoint, ChatMessage, MessageRole, TextBlock

from contextpilot_rag import Prompt

__all__ = ["prompt_to_chat_messages"]

_ROLES: Mapping[str, MessageRole] = {
    "user": MessageRole.USER,
    "assistant": MessageRole.ASSISTANT,
}


def prompt_to_chat_messages(prompt: Prompt) -> list[ChatMessage]:
    """``prompt`` as ``ChatMessage``s for ``llama_index.llms.anthropic.Anthropic``: the
    system prompt, the conversation's history and the turn, each message's content
    blocks as :meth:`Prompt.to_anthropic <contextpilot_rag.Prompt.to_anthropic>` splits
    them (each context block its own), a ``CachePoint`` after each block the pilot's
    cache plan ends a breakpoint on (with its lifetime, ``"5m"`` or ``"1h"``)."""
    request = prompt.to_anthropic()
    messages: list[ChatMessage] = []
    system = request.get("system")
    if system:
        messages.append(ChatMessage(role=MessageRole.SYSTEM, blocks=_blocks(system)))
    for message in request["messages"]:
        messages.append(
            ChatMessage(role=_ROLES[message["role"]], blocks=_blocks(message["content"]))
        )
    return messages


def _blocks(content: Sequence[Mapping[str, Any]]) -> list[ContentBlock]:
    blocks: list[ContentBlock] = []
    for block in content:
        blocks.append(TextBlock(text=block["text"]))
        marker = block.get("cache_control")
        if marker is not None:
            control = CacheControl(type=marker["type"], ttl=marker.get("ttl", "5m"))
            blocks.append(CachePoint(cache_control=control))
    return blocks
