"""The real-engine suite end to end: which workloads, the ratios the issue's targets
are stated in, and their rendering (rich table, markdown, PNG, JSON).

Ratios are taken within one run (arms back to back on one engine), never across
runs: the machine's speed drifts, a ratio of neighbours much less.
"""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..engines.memory import GIB, VLLM_FOOTPRINT_GIB, available_memory_bytes
from .engine_suite import (
    ArmRun,
    EngineTarget,
    FamilyRun,
    Tick,
    WorkloadRun,
    check_repeats,
    engine_tokenizer,
    not_reset_note,
    prediction_cache,
    run_workload,
    simulate_family,
)
from .engine_workloads import (
    SYSTEM,
    EngineWorkload,
    batch_workload,
    multiturn_workload,
    online_workload,
)
from .langchain_path import langchain_available, run_langchain_arm
from .llamaindex_path import llamaindex_available, run_llamaindex_arm
from .sections import pyplot, save_figure

__all__ = [
    "SUITE_WORKLOADS",
    "Check",
    "SuiteResult",
    "checks",
    "markdown",
    "plot",
    "rich_tables",
    "run_suite",
    "suite_kv_cache_gib",
    "write_json",
]

SUITE_WORKLOADS = ("online", "batch", "multi-turn", "langchain", "llamaindex")
"""Workloads of ``--suite engine``; ``langchain`` is the online workload sent through
a LangChain chain (plain and through the pilot with its callback handler),
``llamaindex`` through a LlamaIndex query engine (plain and with the pilot's node
postprocessor and event handler)."""

OnArm = Callable[[str, int], Tick]


def suite_kv_cache_gib(dtype: str | None = None, *, available_bytes: int | None = None) -> int:
    """The suite's vLLM KV cache in GiB, for the compute ``dtype`` (default: the one
    the engine would pick on this CPU): enough that its interleaved arms' blocks all
    fit (the online workload's two arms hold about 200k tokens of SmolLM2's), so each
    arm is measured as if alone. 6 GiB in bf16 (about 280k tokens; the engine's 2 GiB
    default holds about 93k), twice that in float32 (twice the bytes a token); less
    where the memory vLLM can take on the engine's cores
    (``available_bytes``; ``None``: read now,
    :func:`~contextpilot_rag.engines.memory.available_memory_bytes`, and where it cannot
    be read the cache is the size above) leaves under that, after
    :data:`ENGINE_HEADROOM_GIB` for the engine's own processes. The interleaved arms
    may then outgrow the cache, and the report says so."""
    from ..engines.start import default_vllm_dtype, usable_cpus

    wanted = 12 if (dtype or default_vllm_dtype()) == "float32" else 6
    if available_bytes is None:
        available_bytes = available_memory_bytes(usable_cpus())
    if available_bytes is None:
        return wanted
    fits = int(available_bytes / GIB - ENGINE_HEADROOM_GIB)
    return max(1, min(wanted, fits))


ENGINE_HEADROOM_GIB = VLLM_FOOTPRINT_GIB + 1.0
"""Memory left on the node for vLLM's own processes when the suite sizes its cache:
their footprint (:data:`~contextpilot_rag.engines.memory.VLLM_FOOTPRINT_GIB`) and a GiB
of margin."""


FAMILY_SEEDS = 24
"""Seeds of each workload shape simulated beside the engine run."""
EARLIER_ONLINE = {"users_per_topic": 4, "questions": 4, "k": 4}
"""The online stream's size before it was lengthened (:func:`online_workload`
arguments); its family row stays beside the current stream's."""


@dataclass
class SuiteResult:
    engine: dict[str, Any]
    runs: list[WorkloadRun] = field(default_factory=list)
    families: list[FamilyRun] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # parts asked for and not run, and why

    def run(self, name: str) -> WorkloadRun | None:
        return next((run for run in self.runs if run.name == name), None)

    def as_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "workloads": [run.as_json() for run in self.runs],
            "families": [family.as_json() for family in self.families],
            "skipped": list(self.skipped),
        }


def _engine_facts(engine: EngineTarget) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "base_url": engine.base_url,
        "model": engine.model_name,
        "block_size": engine.block_size,
        "kv_cache_tokens": engine.kv_cache_tokens,
    }
    for name in ("kind", "flags"):
        value = getattr(engine, name, None)
        if value is not None:
            facts[name] = value if isinstance(value, str) else list(value)
    env = getattr(engine, "env", None)
    if env:
        facts["env"] = dict(env)
    return facts


def _langchain_run(engine: EngineTarget, workload: EngineWorkload, on_arm: OnArm) -> WorkloadRun:
    from ..pilot import ContextPilot, PilotConfig

    requests = workload.requests
    direct_run = run_workload(engine, _direct_only(workload), on_arm=on_arm)
    direct = direct_run.arms[0]
    plain, _ = run_langchain_arm(
        "langchain, unmodified",
        engine,
        requests,
        pilot=None,
        tick=on_arm("langchain, unmodified", len(requests)),
    )
    ours, handlers = run_langchain_arm(
        "langchain + contextpilot",
        engine,
        requests,
        pilot=ContextPilot(PilotConfig(system_prompt=SYSTEM)),
        tick=on_arm("langchain + contextpilot", len(requests)),
    )
    observed = sum(int(getattr(h, "observed", 0)) for h in handlers)
    notes = (
        *direct_run.notes,
        *_not_reset(plain, ours),
        f"callback handler observed {observed} of {len(requests)} engine usage reports",
        "direct pilot: the contextpilot arm's prompts sent without LangChain, for the "
        "cached-token comparison; its speed-up over the LangChain arm includes LangChain's "
        "own time",
    )
    pairs = (("langchain, unmodified", "langchain + contextpilot"),)
    description = (
        f"{workload.description}; through a LangChain chain (ChatOpenAI), callback handler attached"
    )
    return WorkloadRun("langchain", description, (plain, direct, ours), notes, pairs)


def _not_reset(*arms: ArmRun) -> tuple[str, ...]:
    """A note for each framework arm that began on a cache the engine could not reset."""
    return tuple(not_reset_note(arm.name) for arm in arms if not arm.reset)


def _llamaindex_run(engine: EngineTarget, workload: EngineWorkload, on_arm: OnArm) -> WorkloadRun:
    from ..pilot import ContextPilot, PilotConfig

    requests = workload.requests
    arms = []
    observed = 0
    for name, pilot in (
        ("llamaindex, unmodified", None),
        ("llamaindex + contextpilot", ContextPilot(PilotConfig(system_prompt=SYSTEM))),
    ):
        arm, handler = run_llamaindex_arm(
            name, engine, requests, pilot=pilot, tick=on_arm(name, len(requests))
        )
        arms.append(arm)
        observed += handler.counts.observed if handler is not None else 0
    return WorkloadRun(
        "llamaindex",
        f"{workload.description}; through a LlamaIndex query engine (OpenAILike, "
        "streaming), ContextPilotNodePostprocessor and event handler attached",
        tuple(arms),
        (
            *_not_reset(*arms),
            f"event handler observed {observed} of {len(requests)} engine usage reports",
        ),
        (("llamaindex, unmodified", "llamaindex + contextpilot"),),
    )


def _direct_only(workload: EngineWorkload) -> EngineWorkload:
    arm = workload.arm("contextpilot")
    return EngineWorkload(workload.name, workload.description, (_Renamed(arm, "direct pilot"),))


class _Renamed:
    def __init__(self, arm: Any, name: str) -> None:
        self._arm = arm
        self.name = name
        self.max_tokens = int(arm.max_tokens)

    def __len__(self) -> int:
        return len(self._arm)

    def messages(self, i: int) -> Any:
        return self._arm.messages(i)

    def answered(self, i: int, answer: str) -> None:
        self._arm.answered(i, answer)


def run_suite(
    engine: EngineTarget,
    workloads: Sequence[str] = SUITE_WORKLOADS,
    *,
    seed: int = 0,
    on_arm: OnArm | None = None,
    sizes: dict[str, dict[str, int]] | None = None,
    on_workload: Callable[[SuiteResult], None] | None = None,
    family_seeds: int = FAMILY_SEEDS,
    repeats: int = 1,
) -> SuiteResult:
    """Run ``workloads`` (names from :data:`SUITE_WORKLOADS`) on ``engine``.
    ``sizes`` overrides a workload's size arguments (e.g. ``{"online": {"k": 6}}``);
    ``on_workload`` is called with the results so far after each workload (to save
    them as they come). The online, batch and multi-turn shapes are also simulated over
    ``family_seeds`` seeds (``seed`` onwards) with the engine's tokenizer, where it
    has one (:class:`FamilyRun`; 0 skips it). ``repeats``: passes per arm of the
    online, batch and multi-turn workloads (:func:`run_workload`; the LangChain
    workload's target is cached tokens, not time: one pass)."""
    unknown = set(workloads) - set(SUITE_WORKLOADS)
    if unknown:
        from ..errors import ConfigError

        raise ConfigError(f"unknown workloads {sorted(unknown)}; known: {SUITE_WORKLOADS}")
    check_repeats(repeats)
    sizes = sizes or {}
    progress: OnArm = on_arm or (lambda name, total: lambda: None)
    result = SuiteResult(_engine_facts(engine))
    builders: dict[str, Callable[..., EngineWorkload]] = {
        "online": online_workload,
        "batch": batch_workload,
        "multi-turn": multiturn_workload,
    }
    paths = {  # the online workload through a framework, where it is installed
        "langchain": (langchain_available, _langchain_run),
        "llamaindex": (llamaindex_available, _llamaindex_run),
    }
    for name in workloads:
        if name in paths:
            available, run_path = paths[name]
            if not available():
                result.skipped.append(f"{name}: the framework is not installed")
                continue
            workload = builders["online"](seed=seed, **sizes.get("online", {}))
            result.runs.append(run_path(engine, workload, _labelled(progress, name)))
        else:
            workload = builders[name](seed=seed, **sizes.get(name, {}))
            labelled = _labelled(progress, name)
            result.runs.append(run_workload(engine, workload, on_arm=labelled, repeats=repeats))
        if on_workload is not None:
            on_workload(result)
    if family_seeds > 0:
        result.families += _families(
            engine,
            [
                *(
                    (name, builders[name], sizes.get(name, {}))
                    for name in ("online", "batch", "multi-turn")
                ),
                # the suite's earlier, shorter online stream: four passages a request,
                # fewer users per topic; kept so the stream's effect stays visible
                (
                    "online (k=4, 4 users × 4 questions a topic)",
                    builders["online"],
                    {**sizes.get("online", {}), **EARLIER_ONLINE},
                ),
                # the same conversations retrieved with only the previous question
                # prepended: fewer re-retrieved documents, so less to de-duplicate
                (
                    "multi-turn (query: previous question only)",
                    builders["multi-turn"],
                    {**sizes.get("multi-turn", {}), "query_history": 1},
                ),
            ],
            range(seed, seed + family_seeds),
        )
        if not result.families:
            result.skipped.append(
                "workload families: the engine reports no block size or tokenizer to simulate with"
            )
    return result


def _families(
    engine: EngineTarget,
    shapes: Sequence[tuple[str, Callable[..., EngineWorkload], dict[str, int]]],
    seeds: Sequence[int],
) -> list[FamilyRun]:
    if engine.block_size is None:
        return []
    with httpx.Client(timeout=60.0) as http:
        tokenize = engine_tokenizer(http, engine.base_url, engine.model_name)
        if tokenize is None:
            return []
        return [
            simulate_family(
                name,
                functools.partial(_seeded, build, size),
                seeds,
                tokenize[0],
                new_cache=prediction_cache(engine)[0],
            )
            for name, build, size in shapes
        ]


def _seeded(
    build: Callable[..., EngineWorkload], size: dict[str, int], seed: int
) -> EngineWorkload:
    return build(seed=seed, **size)


def _labelled(on_arm: OnArm, workload: str) -> OnArm:
    return lambda arm, total: on_arm(f"{workload}: {arm}", total)


# -- targets ------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    what: str
    target: str
    measured: str
    met: bool | None  # None: not measured in this run


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


def speedup(plain: ArmRun, ours: ArmRun) -> tuple[float, tuple[float, ...]]:
    """``plain``'s time over ``ours`` (prefill time, or mean TTFT: the arms send the
    same number of requests), and the ratio within each pass. With several passes the
    ratio is the median of the passes' ratios: each pass times both arms side by side
    (interleaved, on vLLM), so its ratio is free of the machine's drift between passes."""
    paired = len(plain.prefill_passes_s) == len(ours.prefill_passes_s) >= 2
    if not paired:
        return _ratio(plain.prefill_s, ours.prefill_s), ()
    ratios = tuple(
        _ratio(a, b) for a, b in zip(plain.prefill_passes_s, ours.prefill_passes_s, strict=True)
    )
    return statistics.median(ratios), ratios


def _per_pass(ratios: Sequence[float]) -> str:
    return f", passes {min(ratios):.2f}–{max(ratios):.2f}x" if ratios else ""


def _sim_error(arm: ArmRun) -> float | None:
    predicted = arm.predicted_computed
    if predicted is None or predicted == 0:
        return None
    return arm.computed_tokens / predicted - 1


def _predicted_hit(arm: ArmRun) -> float | None:
    predicted = arm.predicted_computed
    if predicted is None:
        return None
    return 1 - predicted / max(1, arm.prompt_tokens)


def checks(result: SuiteResult) -> list[Check]:
    """The issue's must-show targets, evaluated on this run."""
    out: list[Check] = []
    targets = {"multi-turn": ("mean TTFT", 2.0), "batch": ("prefill time", 2.0)}
    targets["online"] = ("prefill time", 1.2)
    for name, (measure, goal) in targets.items():
        run = result.run(name)
        if run is None:
            continue
        plain, ours = (run.arm(arm) for arm in run.pairs[0])
        gain, passes = speedup(plain, ours)  # mean TTFT: the arms send as many requests
        hit = _predicted_hit(ours)
        where = f" (sim predicts {hit:.0%} hits{_per_pass(passes)})" if hit is not None else ""
        out.append(
            Check(
                f"{name}: {measure} vs unmodified",
                f">= {goal}x",
                f"{gain:.2f}x{where}",
                gain >= goal,
            )
        )
        computed = _ratio(plain.computed_tokens, ours.computed_tokens)
        out.append(
            Check(
                f"{name}: TTFT reduction / computed-token reduction",
                ">= 0.8",
                f"{gain:.2f}x / {computed:.2f}x = {gain / computed:.2f}",
                gain / computed >= 0.8,
            )
        )
        for plain_name, ours_name in run.pairs[1:]:
            other, _ = speedup(run.arm(plain_name), run.arm(ours_name))
            out.append(
                Check(
                    f"{name}: {ours_name} vs {plain_name} (mean TTFT; never slower)",
                    ">= 1.0x",
                    f"{other:.2f}x",
                    other >= 1.0,
                )
            )
        for arm in run.arms:
            error = _sim_error(arm)
            out.append(
                Check(
                    f"{name}/{arm.name}: engine computed tokens vs simulated",
                    "within ±10%",
                    "n/a" if error is None else f"{error:+.1%}",
                    None if error is None else abs(error) <= 0.10,
                )
            )
    for name in ("online", "batch"):
        run = result.run(name)
        if run is None:
            continue
        overhead = run.arm("contextpilot").prompt_tokens / run.arm("unmodified").prompt_tokens - 1
        out.append(
            Check(
                f"{name}: prompt tokens added by notes and labels",
                "<= 5%",
                f"{overhead:+.1%}",
                overhead <= 0.05,
            )
        )
    lc = result.run("langchain")
    if lc is not None:
        direct, chain = lc.arm("direct pilot"), lc.arm("langchain + contextpilot")
        gap = chain.cached_tokens / max(1, direct.cached_tokens) - 1
        out.append(
            Check(
                "langchain path: cached tokens vs direct pilot",
                "within 5%",
                f"{gap:+.1%}",
                abs(gap) <= 0.05,
            )
        )
    return out


# -- rendering ----------------------------------------------------------------------

_COLUMNS = (
    "arm",
    "requests",
    "mean TTFT s",
    "p95 TTFT s",
    "prefill s",
    "prompt tok",
    "cached (engine)",
    "computed (engine)",
    "computed (sim)",
    "speed-up",
)


def _env_words(env: dict[str, str]) -> str:
    return " ".join(f"{name}={value}" for name, value in sorted(env.items()))


def _prefill(arm: ArmRun) -> str:
    """The arm's prefill time; with several passes, their range after it."""
    passes = arm.prefill_passes_s
    if len(passes) < 2:
        return f"{arm.prefill_s:.1f}"
    return f"{arm.prefill_s:.1f} ({min(passes):.1f}–{max(passes):.1f})"


def _rows(run: WorkloadRun) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for arm in run.arms:
        base = run.baseline_of(arm.name)
        predicted = arm.predicted_computed
        rows.append(
            (
                arm.name,
                str(len(arm.sent)),
                f"{arm.mean_ttft_s:.3f}",
                f"{arm.p95_ttft_s:.3f}",
                _prefill(arm),
                f"{arm.prompt_tokens:,}",
                f"{arm.cached_tokens:,} ({arm.cached_tokens / max(1, arm.prompt_tokens):.0%})",
                f"{arm.computed_tokens:,}",
                "n/a" if predicted is None else f"{predicted:,}",
                f"{speedup(base, arm)[0]:.2f}x",
            )
        )
    return rows


def rich_tables(result: SuiteResult) -> list[Any]:
    """One rich table per workload, then the targets."""
    from rich.table import Table

    tables: list[Any] = []
    for run in result.runs:
        table = Table(title=f"{run.name}: {run.description}")
        for column in _COLUMNS:
            table.add_column(column, justify="left" if column == "arm" else "right")
        for row in _rows(run):
            table.add_row(*row)
        tables.append(table)
    if result.families:
        family = Table(title="workload families (simulated, engine tokenizer)")
        for column in _FAMILY_COLUMNS:
            family.add_column(column)
        for row in _family_rows(result.families):
            family.add_row(*row)
        tables.append(family)
    found = checks(result)
    if found:  # a run of workloads without targets (e.g. llamaindex alone) has none
        targets = Table(title="targets (issue 20)")
        for column in ("what", "target", "measured", "met"):
            targets.add_column(column)
        for check in found:
            met = "n/a" if check.met is None else ("yes" if check.met else "no")
            targets.add_row(check.what, check.target, check.measured, met)
        tables.append(targets)
    return tables


_FAMILY_COLUMNS = (
    "workload",
    "seeds",
    "computed-token reduction min / median / max",
    "predicted hit ratio min",
    "first seed",
)


def _family_rows(families: Sequence[FamilyRun]) -> list[tuple[str, ...]]:
    return [
        (
            family.name,
            f"{family.seeds[0]}–{family.seeds[-1]}",
            f"{min(family.reductions):.2f}x / {statistics.median(family.reductions):.2f}x / "
            f"{max(family.reductions):.2f}x",
            f"{min(family.hit_ratios):.0%}",
            f"{family.reductions[0]:.2f}x",
        )
        for family in families
    ]


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(result: SuiteResult) -> str:
    """The results as markdown: the engine, one table per workload, the targets."""
    engine = result.engine
    parts = [
        f"Engine: `{engine.get('kind', 'external')}` serving `{engine['model']}` "
        f"(block size {engine['block_size']}, prefix cache {engine['kv_cache_tokens']} tokens)"
        + (f"; flags `{' '.join(engine['flags'])}`" if engine.get("flags") else "")
        + (f"; environment `{_env_words(engine['env'])}`" if engine.get("env") else "")
        + ". Requests one at a time, streamed; every arm starts from an empty prefix cache "
        "(its own cache_salt on a reset cache where the notes say the arms ran "
        "interleaved; otherwise the cache reset before the arm, a restart on llama-server, "
        "followed by the same warm-up requests; a note names an arm whose cache could not "
        "be reset); speed-up = mean TTFT of the arm's unmodified counterpart (the first arm "
        "unless the workload pairs them otherwise) / this arm's, with several passes the "
        "median of the passes' ratios. TTFT is the engine request's, from sending it to its "
        "first token: the direct arms' prompts are built before (the pilot's own time is in "
        "the client-overhead section), while the framework arms' TTFT includes the chain "
        "and the pilot in it. In multi-turn workloads each arm's history carries the "
        "answers the engine generated for that arm's own prompts, so the histories also "
        "differ by those answers.",
    ]
    for run in result.runs:
        parts.append(f"**{run.name}** — {run.description}\n\n" + _md_table(_COLUMNS, _rows(run)))
        if run.notes:
            parts.append("Notes: " + "; ".join(run.notes))
    if result.families:
        parts.append(
            "**Workload families** — the same shapes over more seeds, simulated with the "
            "engine's tokenizer, block size and cache size; the engine run above is the "
            "first seed (multi-turn here takes MTRAG's reference answers as the history, "
            "the engine run its own answers)\n\n"
            + _md_table(_FAMILY_COLUMNS, _family_rows(result.families))
        )
    rows = [
        (c.what, c.target, c.measured, "n/a" if c.met is None else ("yes" if c.met else "**no**"))
        for c in checks(result)
    ]
    if rows:
        parts.append("**Targets**\n\n" + _md_table(("what", "target", "measured", "met"), rows))
    if result.skipped:
        parts.append("Not run: " + "; ".join(result.skipped))
    return "\n\n".join(parts)


def plot(result: SuiteResult, path: Path) -> bool:
    """Mean TTFT per arm and workload, and engine vs simulated computed tokens, as a
    PNG; ``False`` when matplotlib is missing (the ``bench`` extra)."""
    plt = pyplot()
    if plt is None:
        return False
    runs = result.runs
    figure, axes = plt.subplots(2, len(runs), figsize=(4.2 * len(runs), 7), squeeze=False)
    for column, run in enumerate(runs):
        names = [arm.name.replace(" (", "\n(") for arm in run.arms]
        top, bottom = axes[0][column], axes[1][column]
        top.bar(names, [arm.mean_ttft_s for arm in run.arms], color="tab:blue")
        top.set_title(run.name)
        top.set_ylabel("mean TTFT (s)")
        positions = range(len(run.arms))
        bottom.bar(
            [p - 0.2 for p in positions], [a.computed_tokens for a in run.arms], 0.4, label="engine"
        )
        bottom.bar(
            [p + 0.2 for p in positions],
            [a.predicted_computed or 0 for a in run.arms],
            0.4,
            label="simulated",
        )
        bottom.set_xticks(list(positions), names)
        bottom.set_ylabel("computed prompt tokens")
        bottom.legend()
        for axis in (top, bottom):
            # four arms' names do not fit side by side: slant them
            axis.tick_params(axis="x", labelsize=7, labelrotation=20 if len(names) > 2 else 0)
            for label in axis.get_xticklabels():
                label.set_horizontalalignment("right" if len(names) > 2 else "center")
    figure.suptitle(f"{result.engine['model']} on {result.engine.get('kind', 'engine')}")
    return save_figure(figure, path)


def write_json(result: SuiteResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.as_json(), indent=2), encoding="utf-8")
