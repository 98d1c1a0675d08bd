"""Retry warm-ups of the combined policy under load (issue 5 ablation).

    python benchmarks/ttca_warmup.py [--requests 300] [--seed 5]

The TTCA simulator (5 heterogeneous models, 1 replica each, retry cap 10) on
synthetic KV-lookup requests (``sim.ttca.synthetic_requests``: 3K-64K tokens,
en/ja/zh) arriving every ``interarrival`` seconds, with no shared prefixes or with
20 prefix groups (the turns of one context share it). Per cell: mean TTCA without
and with warm-ups (``CombinedPolicy(warm_retries=...)``), the change, and the
prompt tokens the fleet prefilled (warm-ups included). The accuracy model is fitted
on a separate synthetic split (seed 1).
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.progress import track
from rich.table import Table

from contextpilot_rag.routing import CombinedPolicy
from contextpilot_rag.sim.ttca import fit_accuracy, run_ttca, synthetic_requests

INTERARRIVALS_S = (0.5, 0.2, 0.1, 0.05)
GROUPS = (0, 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    accuracy = fit_accuracy(synthetic_requests(600, seed=1), seed=0)
    table = Table(title="combined policy: mean TTCA without / with retry warm-ups")
    for column in (
        "interarrival s",
        "prefix groups",
        "TTCA s, no warm-up",
        "TTCA s, warm-ups",
        "change",
        "prefilled k tokens (no / with)",
    ):
        table.add_column(column, justify="right")
    cells = [(ia, groups) for ia in INTERARRIVALS_S for groups in GROUPS]
    for interarrival, groups in track(cells, description="TTCA warm-up sweep"):
        requests = synthetic_requests(
            args.requests, seed=args.seed, prefix_groups=groups, interarrival_s=interarrival
        )
        off, on = (
            run_ttca(requests, CombinedPolicy(accuracy, warm_retries=warm), seed=0)
            for warm in (False, True)
        )
        table.add_row(
            f"{interarrival:g}",
            str(groups or "none"),
            f"{off.ttca_mean_s:.3f}",
            f"{on.ttca_mean_s:.3f}",
            f"{on.ttca_mean_s / off.ttca_mean_s - 1:+.1%}",
            f"{off.computed_tokens / 1000:,.0f} / {on.computed_tokens / 1000:,.0f}",
        )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
