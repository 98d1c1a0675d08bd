"""``prompt_cache_key``: which requests a hosted API should route to one cache.

OpenAI routes a request by a hash of its first tokens combined with
``prompt_cache_key``; requests with the same key and prefix land where that prefix is
cached. The pilot derives the key from what it knows will be shared:

- a turn of a conversation: the conversation, so all its turns keep one key;
- any other request: its system prompt and its first ``lead_blocks`` blocks in final
  order (the reorder puts the blocks it shares with earlier requests first), so
  requests that share that leading prefix share the key.

The key is a digest (never a secret or a user's text); a prompt with a tenant's cache
salt mixes the salt in, so no other tenant's requests share its key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["KEY_PREFIX", "conversation_cache_key", "prefix_cache_key"]

KEY_PREFIX = "cpk-"
_HEX_CHARS = 32


def _digest(*parts: str) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        hasher.update(len(data).to_bytes(8, "big"))
        hasher.update(data)
    return KEY_PREFIX + hasher.hexdigest()[:_HEX_CHARS]


def prefix_cache_key(
    system_key: str, leading_block_ids: Sequence[str], cache_salt: str | None = None
) -> str:
    """The key of requests whose prompt starts with the system prompt named
    ``system_key`` and the blocks ``leading_block_ids``."""
    return _digest("prefix", cache_salt or "", system_key, *leading_block_ids)


def conversation_cache_key(conversation_store_key: str, cache_salt: str | None = None) -> str:
    """The key of every turn of the conversation stored under ``conversation_store_key``
    (which names its tenant, if any)."""
    return _digest("conversation", cache_salt or "", conversation_store_key)
