"""The last decoded records of a shared store, by conversation and version.

A version names one record's content for good (versions are never reused), so a
record read or written at version ``v`` can be kept decoded and reused whenever the
store says the conversation is still at ``v``: the store is still asked every time (no
stale reads), but a record that did not change is neither sent again nor decoded again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ..conversations import Conversation
from ..errors import ConfigError

__all__ = ["RecordCache"]


class RecordCache:
    """At most ``capacity`` conversations (least recently used dropped first), each
    with the version it was read or written at; ``capacity`` 0 keeps none."""

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
            raise ConfigError("the decoded-record cache size must be an int >= 0")
        self._capacity = capacity
        self._lock = threading.Lock()
        self._records: OrderedDict[str, tuple[int, Conversation]] = OrderedDict()

    def version(self, conversation_id: str) -> int:
        """The version held for ``conversation_id`` (0: none)."""
        with self._lock:
            entry = self._records.get(conversation_id)
            return 0 if entry is None else entry[0]

    def get(self, conversation_id: str, version: int) -> Conversation | None:
        """The record held for ``conversation_id`` if it is at ``version``."""
        with self._lock:
            entry = self._records.get(conversation_id)
            if entry is None or entry[0] != version:
                return None
            self._records.move_to_end(conversation_id)
            return entry[1]

    def put(self, conversation: Conversation, version: int) -> None:
        if not self._capacity:
            return
        with self._lock:
            self._records[conversation.conversation_id] = (version, conversation)
            self._records.move_to_end(conversation.conversation_id)
            while len(self._records) > self._capacity:
                self._records.popitem(last=False)

    def discard(self, conversation_id: str) -> None:
        with self._lock:
            self._records.pop(conversation_id, None)
