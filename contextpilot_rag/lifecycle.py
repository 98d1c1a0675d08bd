"""What runs in the background of this process (a server, a subscriber) until stopped:
a ``with`` block starts it and stops it, however the block ends."""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

__all__ = ["Startable"]

_R = TypeVar("_R", bound="Startable")


class Startable:
    """A base for things started and stopped: :meth:`start` returns the started object,
    :meth:`stop` is idempotent, and ``with thing as started:`` does both."""

    def start(self: _R) -> _R:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: _R) -> _R:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
