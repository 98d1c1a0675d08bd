"""The combined policy's configurations the conversation-trace benchmarks name: one
knob at a time around the default (:data:`CONFIGS`), and labels of them joined by
:data:`JOIN` (``benchmarks/conversation_knobs.py`` sweeps them on the tuning half;
``benchmarks/conversation_routing.py`` reports its choice on the held-out half)."""

from __future__ import annotations

from contextpilot_rag.routing.combined import CombinedOptions

__all__ = ["CONFIGS", "JOIN", "options_of"]

# (label, options over the default): one knob at a time around the default
CONFIGS: tuple[tuple[str, CombinedOptions], ...] = (
    ("default", {}),
    ("externality 0.7", {"externality_weight": 0.7}),
    ("externality 1.5", {"externality_weight": 1.5}),
    ("externality 2", {"externality_weight": 2.0}),
    ("queue externality 0.5", {"queue_externality_weight": 0.5}),
    ("queue externality 2", {"queue_externality_weight": 2.0}),
    ("queue externality 4", {"queue_externality_weight": 4.0}),
    ("queue externality 8", {"queue_externality_weight": 8.0}),
    ("queue externality 16", {"queue_externality_weight": 16.0}),
    ("queue externality 32", {"queue_externality_weight": 32.0}),
    ("queue externality 64", {"queue_externality_weight": 64.0}),
    ("hold wait 0.5 s", {"hold_wait_s": 0.5}),
    ("hold wait 3 s", {"hold_wait_s": 3.0}),
    ("no late binding", {"hold_wait_s": None}),
    ("max hold 30 s", {"max_hold_s": 30.0}),
    ("duty tau 15 s", {"duty_tau_s": 15.0}),
    ("duty tau 60 s", {"duty_tau_s": 60.0}),
    ("TTFT budget p95", {"ttft_budget_percentile": 95.0}),
    ("E2E tail weighting 0.85 / 0.2", {"tail_quantile": 0.85, "tail_discount": 0.2}),
    ("E2E tail weighting 0.7 / 0.5", {"tail_quantile": 0.7, "tail_discount": 0.5}),
)


JOIN = " + "  # a second-stage label: the first stage's choice, then one more knob


def options_of(label: str) -> CombinedOptions:
    """The options of a configuration label: one of :data:`CONFIGS`, or labels of them
    joined by :data:`JOIN` (their options merged, later ones over earlier ones)."""
    table = dict(CONFIGS)
    merged: CombinedOptions = {}
    for part in label.split(JOIN):
        merged.update(table[part])
    return merged
