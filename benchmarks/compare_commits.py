"""Decision cost and ``optimize()`` cost of the working tree against an earlier commit.

    python benchmarks/compare_commits.py --base e3bde26 --write docs/benchmarks.md

Checks a refactor for regressions: the base commit is checked out into a temporary git
worktree, and the same child script (``lib/ab_child.py``, public API only) runs against
each side in turn, the sides alternating ``--runs`` times so that a slow period of a
shared machine hits both. Reports each side's median of per-run medians and their
ratio (this tree / base), also of the fastest runs. Writes the ``commit-comparison``
generated section.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from lib.sections import markdown_table, provenance, spread, write_section
from rich.progress import track

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "lib" / "ab_child.py"


def run_side(checkout: Path, requests: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run(
        [sys.executable, str(CHILD), str(requests)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    reply = json.loads(out)
    return {name: float(value) for name, value in reply["timings_us"].items()}


def compare(base: str, runs: int, requests: int) -> tuple[list[dict[str, float]], ...]:
    with tempfile.TemporaryDirectory() as scratch:
        checkout = Path(scratch) / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(checkout), base],
            check=True,
        )
        try:
            before, after = [], []
            for _ in track(range(runs), description="alternating runs"):
                before.append(run_side(checkout, requests))
                after.append(run_side(ROOT, requests))
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(checkout)],
                check=True,
            )
    return before, after


def section(
    base: str,
    runs: int,
    requests: int,
    before: list[dict[str, float]],
    after: list[dict[str, float]],
) -> str:
    rows = []
    for name in before[0]:
        old = [run[name] for run in before]
        new = [run[name] for run in after]
        ratio = statistics.median(new) / statistics.median(old)
        fastest = min(new) / min(old)
        rows.append(
            (name, spread(old, ".1f"), spread(new, ".1f"), f"{ratio:.3f}", f"{fastest:.3f}")
        )
    command = (
        f"python benchmarks/compare_commits.py --base {base} --runs {runs} "
        f"--requests {requests} --write docs/benchmarks.md"
    )
    lines = [
        "## This tree against an earlier commit (`benchmarks/compare_commits.py`)",
        "",
        provenance(command, runs, "median of per-run medians with min–max; sides alternate"),
        "",
        "`optimize`: median µs per call over an online stream; `decision:NAME`: the policy's",
        "median decision cost in µs (`measure_decision_cost`). Ratios: this tree / base, of the",
        "medians over runs and of the fastest runs (a shared machine that switches between a",
        "fast and a slow state moves medians; the fastest runs compare like with like).",
        "",
        *markdown_table(
            ["measure", f"base {base} µs", "this tree µs", "ratio", "fastest ratio"], rows
        ),
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--runs", type=int, default=5, help="alternations (default 5)")
    parser.add_argument("--requests", type=int, default=5000, help="optimize() calls per run")
    parser.add_argument("--write", type=Path, help="the docs file to write the section into")
    args = parser.parse_args()
    before, after = compare(args.base, args.runs, args.requests)
    body = section(args.base, args.runs, args.requests, before, after)
    if args.write:
        write_section(args.write, "commit-comparison", body)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
