"""Late binding: the order in which held requests are offered to the policy again.

A policy may hold a request (:attr:`~contextpilot_rag.routing.types.Decision.hold_s`);
whoever keeps it — the routing client (:mod:`~contextpilot_rag.routing.client.holding`)
or the fleet simulator (:mod:`contextpilot_rag.sim.fleet`) — offers every held request
again when a prefill ends, in the order of :func:`release_order`. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math

__all__ = ["release_order"]


def release_order(predicted_ttft_s: float | None, held_seq: int) -> tuple[float, int]:
    """The sort key of a held request at a release: the TTFT its last hold predicted,
    smallest first, then ``held_seq`` (the order it was held in).

    A request held without a prediction goes first. Its cost is unknown, so nothing
    shows it behind anyone; placed last, every newly held request with a prediction
    would overtake it at each release, and under steady load it would wait for its own
    hold timer every time (starvation). Offered first, the policy sees it while the
    capacity just freed is free, and may hold it again."""
    return (-math.inf if predicted_ttft_s is None else predicted_ttft_s, held_seq)
