"""The combined policy's configurations the conversation-trace benchmarks name: one
knob at a time around the default (:data:`CONFIGS`), labels of them joined by
:data:`JOIN`, and every knob drawn at once (``random N``, :func:`random_options`)
(``benchmarks/conversation_knobs.py`` sweeps them on the tuning half;
``benchmarks/conversation_routing.py`` reports its choice on the held-out half)."""

from __future__ import annotations

import numpy as np

from contextpilot_rag.routing.combined import CombinedOptions

__all__ = ["CONFIGS", "JOIN", "RANDOM", "options_of", "random_labels", "random_options"]

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


RANDOM = "random "  # a joint draw's label: this, then its number (1, 2, ...)
_RANDOM_SEED = 2211
HOLDS_S = (None, 0.5, 1.0, 2.0, 3.0, 5.0)


def random_options(number: int) -> CombinedOptions:
    """The ``number``-th joint draw (deterministic): the queue externality log-uniform
    in 4–64 (the range where the one-knob sweep's worst tails were shortest), the
    externality 0.5–2, a hold wait of :data:`HOLDS_S`, the duty time constant 10–60 s,
    and with probability 0.7 E2E tail weighting (quantile 0.6–0.95, discount 0.1–0.8)."""
    if number < 1:
        raise ValueError(f"random draws are numbered from 1, got {number}")
    rng = np.random.default_rng([_RANDOM_SEED, number])
    options: CombinedOptions = {
        "queue_externality_weight": round(float(np.exp(rng.uniform(np.log(4), np.log(64)))), 2),
        "externality_weight": round(float(rng.uniform(0.5, 2.0)), 2),
        "hold_wait_s": HOLDS_S[int(rng.integers(len(HOLDS_S)))],
        "duty_tau_s": round(float(rng.uniform(10.0, 60.0)), 1),
    }
    if rng.random() < 0.7:
        options["tail_quantile"] = round(float(rng.uniform(0.6, 0.95)), 2)
        options["tail_discount"] = round(float(rng.uniform(0.1, 0.8)), 2)
    return options


def random_labels(count: int) -> tuple[str, ...]:
    """The labels of the first ``count`` joint draws."""
    return tuple(f"{RANDOM}{number}" for number in range(1, count + 1))


def options_of(label: str) -> CombinedOptions:
    """The options of a configuration label: one of :data:`CONFIGS`, labels of them
    joined by :data:`JOIN` (their options merged, later ones over earlier ones), or a
    joint draw ``random N``."""
    if label.startswith(RANDOM):
        return random_options(int(label.removeprefix(RANDOM)))
    table = dict(CONFIGS)
    merged: CombinedOptions = {}
    for part in label.split(JOIN):
        merged.update(table[part])
    return merged
