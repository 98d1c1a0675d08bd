"""Retry warm-ups of the combined policy under load (an ablation of the TTCA runs).

    python benchmarks/ttca_warmup.py --write docs/benchmarks.md

The TTCA simulator (5 heterogeneous models, 1 replica each, retry cap 10) on
synthetic KV-lookup requests (``sim.ttca.synthetic_requests``: 3K-64K tokens,
en/ja/zh) arriving every ``interarrival`` seconds, with no shared prefixes or with
20 prefix groups (the turns of one context share it). Per cell: mean TTCA without
and with warm-ups (``CombinedPolicy(warm_retries=...)``), the change, and the
prompt tokens the fleet prefilled (warm-ups included). The accuracy model is fitted
on a separate synthetic split (seed 1). Writes the ``ttca-warmup`` generated section.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from lib.sections import markdown_table, provenance, write_section
from rich.progress import track

from contextpilot_rag.routing import CombinedPolicy
from contextpilot_rag.sim.ttca import fit_accuracy, run_ttca, synthetic_requests

INTERARRIVALS_S = (0.5, 0.2, 0.1, 0.05)
GROUPS = (0, 20)
HEADERS = (
    "interarrival s",
    "prefix groups",
    "TTCA s, no warm-up",
    "TTCA s, warm-ups",
    "change",
    "prefilled k tokens (no / with)",
)


def sweep(requests: int, seed: int) -> list[list[str]]:
    accuracy = fit_accuracy(synthetic_requests(600, seed=1), seed=0)
    rows = []
    cells = [(ia, groups) for ia in INTERARRIVALS_S for groups in GROUPS]
    for interarrival, groups in track(cells, description="TTCA warm-up sweep"):
        workload = synthetic_requests(
            requests, seed=seed, prefix_groups=groups, interarrival_s=interarrival
        )
        off, on = (
            run_ttca(workload, CombinedPolicy(accuracy, warm_retries=warm), seed=0)
            for warm in (False, True)
        )
        rows.append(
            [
                f"{interarrival:g}",
                str(groups or "none"),
                f"{off.ttca_mean_s:.3f}",
                f"{on.ttca_mean_s:.3f}",
                f"{on.ttca_mean_s / off.ttca_mean_s - 1:+.1%}",
                f"{off.computed_tokens / 1000:,.0f} / {on.computed_tokens / 1000:,.0f}",
            ]
        )
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args(argv)
    rows = sweep(args.requests, args.seed)
    out = [
        "## Retry warm-ups under load (`benchmarks/ttca_warmup.py`)",
        "",
        provenance(
            "python benchmarks/ttca_warmup.py " + " ".join(argv),
            1,
            "none: every figure is simulated (seeded, simulated time)",
        ),
        f"- workload: {args.requests} synthetic KV lookups per cell (seed {args.seed}), "
        "5 models × 1 replica, retry cap 10",
        "",
        *markdown_table(HEADERS, rows),
    ]
    text = "\n".join(out) + "\n"
    if args.write:
        write_section(args.write, "ttca-warmup", text)
        print(f"wrote {args.write}", file=sys.stderr)
    else:
        print(text)


if __name__ == "__main__":
    main()
