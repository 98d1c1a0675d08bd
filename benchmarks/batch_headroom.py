"""How much is left to gain on the batch targets' shape: other searches, and where the
bound is loose, written into docs.

    python benchmarks/batch_headroom.py --write docs/benchmarks.md \
        --plot docs/img/batch_headroom.png

On the held-out draws of the ``batch, D=2,000 k=15`` family of ``benchmarks/families.py``
(same generators and seed), in the unit the bounds use (block tokens shared in an
unbounded cache, as a share of all block tokens):

- **other searches against ours**: ``plan_batch`` as shipped; the same plan refined
  much longer (``refine_sequences`` with more passes and joint partners); and a plan
  built the other way round, *cover first*: the deepest groups first (at one depth,
  requests are grouped greedily by the heaviest block set they all hold, as many as
  it covers), the groups' shared sets planned as requests of their own, each member's
  other blocks planned within its group, then refined as ``plan_batch`` refines.
- **where the bound is loose**: the trie's width at a few depths — how many nodes span
  depth ``t`` (weight from the start of the sequences) in our plan; in a cover of the
  requests by block sets heavier than ``t`` found greedily at that depth alone (what
  one depth allows, not a plan: a plan's depths must nest); and two lower bounds on
  every plan's width there: the independent set the separation bound uses (requests
  that pairwise share at most ``t``), and the fractional packing of the linear
  programme whose constraints are every block set heavier than ``t`` (no set's holders
  together more than one node: solved with HiGHS through scipy).

The separation bound subtracts the independent sets' sizes at every depth; where the
linear programme's packing is larger the bound is loose by the difference, and where
the greedy cover is much narrower than our plan a plan might gain there, if the depths
nest. Writes the ``batch-headroom`` generated section of ``--write``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from families import SEPARATION_LEVELS, coded_requests, draw_family, make_workload, request_tokens
from families import unmodified_prompts as family_prompts
from lib.report import ordered_map, progress_bars
from lib.sections import markdown_table, provenance, pyplot, save_figure, write_or_print

from contextpilot_rag.batch import (
    JOINT_PARTNERS,
    plan_batch,
    popularity_rank,
    refine_sequences,
    shared_tokens,
)
from contextpilot_rag.batch.plan import sequences_of
from contextpilot_rag.bench.optimum import separation_bound, separation_width
from contextpilot_rag.tokenizers import default_tokenizer

SECTION = "batch-headroom"
FAMILY = "batch, D=2,000 k=15"
LONG_PASSES, LONG_PAIRS = 4, 8  # "refined much longer"
COVER_DEPTHS = (0.4, 0.55, 0.7)  # cover-first group depths, of the mean request weight
PROBE_DEPTHS = (0.15, 0.25, 0.35, 0.45)  # width probes, of the mean request weight


@dataclass(frozen=True)
class Width:
    """The trie's width at one depth: ours, a greedy cover at that depth alone, and
    two lower bounds on every plan's width there."""

    depth: float
    alive: int  # requests heavier than the depth
    ours: int
    cover: int
    packing: float  # the linear programme's fractional packing
    independent: int  # the separation bound's independent set


@dataclass(frozen=True)
class Headroom:
    index: int
    requests: int
    zipf: float
    ours: float  # shared block tokens / all block tokens
    longer: float
    cover_first: float
    cover_depth: float  # of the mean request weight, the best cover-first plan's
    bound: float  # the separation bound, same unit
    widths: tuple[Width, ...]
    seconds: float


class _Itemsets:
    """Every block set held by at least two requests (``found[set] = (weight,
    holders)``, holders as a bitmask of rows): a depth-first enumeration of each
    request's blocks, most held first, pruned where fewer than two hold the set
    (holding is anti-monotone, so nothing is missed)."""

    def __init__(self, sets: Sequence[Sequence[int]], weights: Sequence[float]) -> None:
        self.count = len(sets)
        self.weights = weights
        holders: dict[int, int] = defaultdict(int)
        for row, blocks in enumerate(sets):
            for block in blocks:
                holders[block] |= 1 << row
        found: dict[frozenset[int], tuple[float, int]] = {}
        for blocks in sets:
            shared = sorted((b for b in blocks if holders[b].bit_count() > 1),
                            key=lambda b: -holders[b].bit_count())  # fmt: skip
            stack: list[tuple[int, int, tuple[int, ...], float]] = [(0, -1, (), 0.0)]
            while stack:
                start, mask, prefix, weight = stack.pop()
                for k in range(start, len(shared)):
                    block = shared[k]
                    held = holders[block] if mask == -1 else mask & holders[block]
                    if held.bit_count() < 2:
                        continue
                    items = (*prefix, block)
                    key = frozenset(items)
                    if key not in found:
                        found[key] = (weight + weights[block], held)
                    stack.append((k + 1, held, items, weight + weights[block]))
        self.found = found

    def heavier(self, depth: float) -> list[tuple[frozenset[int], int]]:
        """The sets heavier than ``depth`` and their holders."""
        return [(key, held) for key, (weight, held) in self.found.items() if weight > depth]

    def minimal(self, key: frozenset[int], depth: float) -> bool:
        """Whether every proper subset of ``key`` (heavier than ``depth``) is not."""
        return self.found[key][0] - min(self.weights[block] for block in key) <= depth

    def rows(self, mask: int) -> np.ndarray:
        raw = np.frombuffer(mask.to_bytes((self.count + 7) // 8, "little"), dtype=np.uint8)
        return np.flatnonzero(np.unpackbits(raw, bitorder="little")[: self.count])


def _mask(rows: np.ndarray) -> int:
    mask = 0
    for row in rows:
        mask |= 1 << int(row)
    return mask


def greedy_cover(
    itemsets: _Itemsets, heavy: np.ndarray, depth: float
) -> tuple[list[tuple[frozenset[int], int]], int]:
    """A cover of the requests heavier than ``depth`` by block sets heavier than it:
    repeatedly the set held by the most requests not yet covered (two at least).
    Returns the chosen (set, the requests it took, as a mask) and the mask of the
    requests left, one node each."""
    uncovered = _mask(np.flatnonzero(heavy > depth))
    candidates = [(key, held & uncovered) for key, held in itemsets.heavier(depth)]
    candidates = [(key, held) for key, held in candidates if held.bit_count() > 1]
    chosen: list[tuple[frozenset[int], int]] = []
    while candidates:
        key, held = max(candidates, key=lambda pair: (pair[1] & uncovered).bit_count())
        taken = held & uncovered
        if taken.bit_count() < 2:
            break
        chosen.append((key, taken))
        uncovered &= ~taken
        candidates = [(k, h) for k, h in candidates if (h & uncovered).bit_count() > 1]
    return chosen, uncovered


def cover_width(itemsets: _Itemsets, heavy: np.ndarray, depth: float) -> int:
    chosen, left = greedy_cover(itemsets, heavy, depth)
    return len(chosen) + left.bit_count()


def packing_bound(itemsets: _Itemsets, heavy: np.ndarray, depth: float) -> float:
    """The largest fractional packing of the requests heavier than ``depth`` in which
    the holders of every block set heavier than ``depth`` weigh at most 1 together: a
    lower bound on the nodes spanning ``depth`` in every plan (weak duality: those
    nodes are a cover of the requests by such sets). Only the minimal sets constrain
    (a set's holders include its supersets')."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix

    alive = heavy > depth
    alive_mask = _mask(np.flatnonzero(alive))
    rows: list[np.ndarray] = []
    seen: set[int] = set()
    for key, held in itemsets.heavier(depth):
        held &= alive_mask
        if held.bit_count() < 2 or held in seen or not itemsets.minimal(key, depth):
            continue
        seen.add(held)
        rows.append(itemsets.rows(held))
    if not rows:
        return float(alive.sum())
    lengths = [len(r) for r in rows]
    matrix = csr_matrix(
        (np.ones(sum(lengths)), (np.repeat(np.arange(len(rows)), lengths), np.concatenate(rows))),
        shape=(len(rows), itemsets.count),
    )
    result = linprog(
        -alive.astype(float),
        A_ub=matrix,
        b_ub=np.ones(len(rows)),
        bounds=(0.0, 1.0),
        method="highs",
    )
    if result.status != 0:
        raise RuntimeError(f"HiGHS did not solve the packing at depth {depth}: {result.message}")
    return float(-result.fun)


def _width_of(sequences: Sequence[Sequence[int]], weights: Sequence[float], depth: float) -> int:
    """Nodes of the trie of ``sequences`` that span ``depth``."""
    nodes = set()
    for sequence in sequences:
        total = 0.0
        for end, block in enumerate(sequence):
            total += weights[block]
            if total > depth:
                nodes.add(tuple(sequence[: end + 1]))
                break
    return len(nodes)


def cover_first(
    requests: Sequence[Sequence[int]],
    weights: Sequence[float],
    itemsets: _Itemsets,
    heavy: np.ndarray,
    depth: float,
) -> list[list[int]]:
    """Sequences planned cover first (module docstring) at ``depth``."""
    rank = popularity_rank(requests)
    chosen, left = greedy_cover(itemsets, heavy, depth)
    light = _mask(np.flatnonzero(heavy <= depth))  # no node spans the depth: alone
    singles = [int(row) for row in itemsets.rows(left | light)]
    heads = [sorted(key) for key, _ in chosen] + [list(requests[row]) for row in singles]
    head_sequences = sequences_of(heads, plan_batch(heads, weights=weights).orders)
    sequences: list[list[int]] = [[] for _ in requests]
    for (key, taken), head in zip(chosen, head_sequences, strict=False):
        members = [int(row) for row in itemsets.rows(taken)]
        rest = [[b for b in requests[row] if b not in key] for row in members]
        if all(rest):
            inner = sequences_of(rest, plan_batch(rest, weights=weights).orders)
        else:
            inner = [sorted(r, key=lambda b: rank[b]) for r in rest]
        for row, tail in zip(members, inner, strict=True):
            sequences[row] = [*head, *tail]
    for row, head in zip(singles, head_sequences[len(chosen) :], strict=True):
        sequences[row] = head
    return refine_sequences(sequences, weights, rank, passes=1, pairs=JOINT_PARTNERS)


def measure(job: tuple[int, int]) -> Headroom:
    """Draw ``index`` of the family with ``requests`` requests."""
    index, requests_count = job
    started = time.perf_counter()
    draw = draw_family(FAMILY, max(12, index + 1), 0, shape_requests=requests_count)[index]
    tokenizer = default_tokenizer()
    workload = make_workload(draw, requests_count, 0)
    rows = request_tokens(family_prompts(workload, tokenizer), tokenizer)
    requests, sizes = coded_requests(rows)
    weights = [sizes.get(code, 0.0) for code in range(max(sizes) + 1)]
    total = sum(weights[b] for request in requests for b in request)
    identity = [list(range(len(r))) for r in requests]

    def share(sequences: Sequence[Sequence[int]]) -> float:
        return shared_tokens(sequences, identity, weights) / total

    ours = sequences_of(requests, plan_batch(requests, weights=weights).orders)
    rank = popularity_rank(requests)
    longer = refine_sequences(ours, weights, rank, passes=LONG_PASSES, pairs=LONG_PAIRS)
    sets = [sorted(set(r)) for r in requests]
    itemsets = _Itemsets(sets, weights)
    heavy = np.array([sum(weights[b] for b in s) for s in sets])
    mean = float(heavy.mean())
    best_cover, cover_depth = max(
        (share(cover_first(requests, weights, itemsets, heavy, f * mean)), f) for f in COVER_DEPTHS
    )
    by_code = dict(enumerate(weights))  # the bounds take a mapping
    widths = []
    for fraction in PROBE_DEPTHS:
        depth = fraction * mean
        alive = heavy > depth
        widths.append(
            Width(
                fraction,
                int(alive.sum()),
                _width_of(ours, weights, depth),
                cover_width(itemsets, heavy, depth),
                packing_bound(itemsets, heavy, depth),
                separation_width(sets, by_code, depth),
            )
        )
    bound = separation_bound(sets, by_code, levels=SEPARATION_LEVELS) / total
    return Headroom(
        index,
        len(requests),
        draw.zipf,
        share(ours),
        share(longer),
        best_cover,
        cover_depth,
        bound,
        tuple(widths),
        time.perf_counter() - started,
    )


# --- report ------------------------------------------------------------------------------


def _pct(value: float) -> str:
    return f"{value:.1%}"


def _versus(value: float, ours: float) -> str:
    return f"{value / ours - 1:+.2%}"


def _most_gained(results: Sequence[Headroom]) -> str:
    gain = max(max(r.longer, r.cover_first) / r.ours - 1 for r in results)
    return f"{gain:.2%}"


def _least_above(results: Sequence[Headroom]) -> str:
    return f"{min(r.bound / r.ours - 1 for r in results):.1%}"


def report(results: Sequence[Headroom], command: str, seconds: float, image: Path | None) -> str:
    lines = [
        "## Batch planner headroom on the targets' shape (`benchmarks/batch_headroom.py`)",
        "",
        provenance(command, 1, "one run; shares and widths are deterministic (seeded draws)"),
        f"- workloads: draws {', '.join(str(r.index) for r in results)} (held out: odd) of the "
        f"`{FAMILY}` family of the `families` section (same generators, seed 0), "
        f"{results[0].requests:,} requests each; block tokens shared in an unbounded cache, "
        "as a share of all block tokens (the unit of the bounds; the system prompt and "
        "the questions are left out)",
        f"- refined longer: `refine_sequences(..., passes={LONG_PASSES}, pairs={LONG_PAIRS})` "
        "on our plan; cover first: the best of the group depths "
        + ", ".join(f"{f:g}" for f in COVER_DEPTHS)
        + " of the mean request weight",
        f"- whole run: {seconds:.0f} s",
        "",
        "### Other searches against ours",
        "",
        "*Bound*: the separation bound of the `families` section, on the blocks. "
        f"The best other search shares at most {_most_gained(results)} more than ours "
        f"does; the bound lies at least {_least_above(results)} above ours.",
        "",
    ]
    rows = [
        [
            str(r.index),
            f"{r.zipf:.2f}",
            _pct(r.ours),
            f"{_pct(r.longer)} ({_versus(r.longer, r.ours)})",
            f"{_pct(r.cover_first)} ({_versus(r.cover_first, r.ours)}, at {r.cover_depth:g})",
            _pct(r.bound),
            _pct(r.ours / r.bound),
            f"{r.seconds:.0f} s",
        ]
        for r in results
    ]
    lines += markdown_table(
        ["#", "Zipf", "ours", "refined longer", "cover first", "bound", "ours of bound", "seconds"],
        rows,
    )
    lines += [
        "",
        "### The trie's width at a few depths",
        "",
        "Depth: weight from the start of a sequence, as a share of the mean request weight; "
        "*requests*: those heavier than it (each passes one node there). *Ours*: our plan's "
        "nodes there. *Greedy cover*: nodes a cover by block sets heavier than the depth "
        "needs, found greedily at that depth alone — not a plan (a plan's depths nest), so "
        "a plan at most as narrow can only be hoped for. Lower bounds on every plan: "
        "*packing*, the linear programme's; *independent*, the set the separation bound "
        "subtracts. The bound counts every depth at the independent set: where the packing "
        "is wider, the bound is loose by the difference.",
        "",
    ]
    width_rows = [
        [
            str(r.index),
            f"{w.depth:g}",
            f"{w.alive:,}",
            f"{w.ours:,}",
            f"{w.cover:,}",
            f"{w.packing:,.0f}",
            f"{w.independent:,}",
        ]
        for r in results
        for w in r.widths
    ]
    lines += markdown_table(
        ["#", "depth", "requests", "ours", "greedy cover", "packing", "independent"], width_rows
    )
    if image is not None:
        lines += ["", f"![trie width per depth]({image})"]
    return "\n".join(lines)


def plot(results: Sequence[Headroom], path: Path) -> bool:
    plt = pyplot()
    if plt is None or not results:
        return False
    figure, axes = plt.subplots(1, len(results), figsize=(3.2 * len(results), 3.2), sharey=False)
    for axis, result in zip(np.atleast_1d(axes), results, strict=True):
        depths = [w.depth for w in result.widths]
        for label, values in (
            ("ours", [w.ours for w in result.widths]),
            ("greedy cover", [w.cover for w in result.widths]),
            ("packing (LP)", [w.packing for w in result.widths]),
            ("independent", [w.independent for w in result.widths]),
        ):
            axis.plot(depths, values, marker="o", label=label)
        axis.set_title(f"#{result.index}")
        axis.set_xlabel("depth / mean request weight")
    np.atleast_1d(axes)[0].set_ylabel("trie nodes at that depth")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    save_figure(figure, path)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", type=Path, help="docs file to write the section into")
    parser.add_argument("--plot", type=Path, help="PNG of the widths per depth")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument(
        "--draws", default="1,3,5,7,9,11", help="family draws (odd: held out; default all six)"
    )
    parser.add_argument(
        "--requests", type=int, default=2000, help="requests per workload (default 2,000)"
    )
    args = parser.parse_args(argv)
    try:
        import scipy  # noqa: F401
    except ImportError:
        parser.error("needs scipy (pip install scipy; `make bench-families` installs it)")
    try:
        draws = [int(d) for d in args.draws.split(",")]
    except ValueError:
        parser.error(f"--draws takes comma-separated draw numbers, got {args.draws!r}")
    if any(draw < 0 for draw in draws) or args.requests < 2 or args.jobs < 1:
        parser.error("--draws must be >= 0, --requests >= 2 and --jobs >= 1")
    started = time.perf_counter()
    with progress_bars() as progress:
        jobs = [(draw, args.requests) for draw in draws]
        results = ordered_map(measure, jobs, args.jobs, progress("workloads", len(draws)))
    image = None
    if args.plot and plot(results, args.plot) and args.write:
        image = Path(os.path.relpath(args.plot.resolve(), args.write.resolve().parent))
    command = "python benchmarks/batch_headroom.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    text = report(results, command.strip(), time.perf_counter() - started, image)
    write_or_print(text, SECTION, args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
