"""What the provider's cache is believed to hold: the prefixes the pilot placed
breakpoints at, and when each was last written or read.

Invariant: an entry's time is the last time a prompt carried a breakpoint at exactly
that prefix; the provider keeps it while ``now - time <= ttl_s`` (a read refreshes
it). Bounded to ``capacity`` prefixes, least recently refreshed dropped first. Not
thread-safe by itself: the pilot's lock guards it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from ..errors import ConfigError

__all__ = ["CacheLedger"]


class CacheLedger:
    def __init__(self, capacity: int = 65_536) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ConfigError("CacheLedger capacity must be a positive int")
        self._capacity = capacity
        self._written: OrderedDict[Hashable, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._written)

    def fresh(self, prefix: Hashable, now: float, ttl_s: float) -> bool:
        """Whether a breakpoint at ``prefix`` was written or read within ``ttl_s``."""
        written = self._written.get(prefix)
        return written is not None and now - written <= ttl_s

    def record(self, prefix: Hashable, now: float) -> None:
        """A prompt carries a breakpoint at ``prefix`` now."""
        self._written[prefix] = now
        self._written.move_to_end(prefix)
        while len(self._written) > self._capacity:
            self._written.popitem(last=False)
