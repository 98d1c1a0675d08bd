"""One logical stream delivered across retries: a retry resumes after the text the
caller already has, or fails the call — the caller never gets less than it was given."""

from __future__ import annotations

from ...errors import RoutingError

__all__ = ["Resume"]


class Resume:
    """Delivers one logical stream across retries. Invariant: ``_parts`` joined is
    the text handed to a streaming caller, and what a caller got is never taken back:
    a retry must reproduce it (that part is skipped, not delivered again) before it
    delivers more; a retry that diverges from it, or ends before reproducing all of
    it, fails the request. A non-streaming call (``streaming`` false) has handed
    nothing out, so each attempt's text is taken whole."""

    __slots__ = ("_matched", "_parts", "_replay", "stale_retry", "streaming")

    def __init__(self, streaming: bool) -> None:
        self.streaming = streaming
        self._parts: list[str] = []
        self._replay = ""  # the delivered text the current attempt has to reproduce
        self._matched = 0  # how much of it the current attempt reproduced so far
        self.stale_retry = True  # one retry on the same endpoint after a stale connection

    def restart(self) -> None:
        """A new attempt begins: it has to reproduce everything delivered so far."""
        self._replay, self._matched = "".join(self._parts), 0

    def feed(self, piece: str) -> str:
        """The part of the attempt's next ``piece`` that is new to the caller."""
        if self._matched < len(self._replay):
            piece = self._reproduce(piece)
        if piece and self.streaming:
            self._parts.append(piece)
        return piece

    def _reproduce(self, piece: str) -> str:
        """Match ``piece`` against the delivered text; the rest of it is new."""
        start = self._matched
        overlap = min(len(piece), len(self._replay) - start)
        if not self._replay.startswith(piece[:overlap], start):
            raise RoutingError("a retried stream diverged from the text already delivered")
        self._matched += overlap
        return piece[overlap:]

    def finish(self) -> None:
        """The attempt ended: it must have reproduced all the delivered text."""
        if self._matched < len(self._replay):
            raise RoutingError(
                f"a retried stream ended after {self._matched} characters, shorter than "
                f"the {len(self._replay)} already delivered"
            )
