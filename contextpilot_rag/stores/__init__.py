"""Conversation stores shared beyond one process, behind the
:class:`~contextpilot_rag.conversations.ConversationStore` protocol.

- in memory (:class:`~contextpilot_rag.conversations.InMemoryConversationStore`, the
  default): one process;
- :class:`SQLiteConversationStore`: one host, several processes, kept across restarts;
- :class:`RedisConversationStore`: several processes and hosts (``redis`` extra).

``ContextPilot(store=...)`` takes a store object or a URL (:func:`open_store`):
``redis://HOST:PORT/DB`` or ``sqlite:///PATH``. Both shared stores are versioned
(compare-and-set writes), so several processes on one store behave as one: see
``docs/stores.md``. Both also hold the context index's log
(:mod:`.index_log`), through which pilots on one store share their index.
"""

from __future__ import annotations

from .redis import RedisConversationStore
from .serialize import decode_conversation, encode_conversation
from .sqlite import SQLiteConversationStore
from .url import StoreURL, open_store, parse_store_url, resolve_store

__all__ = [
    "RedisConversationStore",
    "SQLiteConversationStore",
    "StoreURL",
    "decode_conversation",
    "encode_conversation",
    "open_store",
    "parse_store_url",
    "resolve_store",
]
