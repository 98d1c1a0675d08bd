"""What ``PilotConfig(system_into_user=True)`` saves under a chat template that moves
the system message: prompt tokens the engine computed, per conversation turn, on
llama-server with a publisher's template.

    python benchmarks/system_fold.py --write docs/benchmarks.md --plot docs/img/system_fold.png

Mistral Nemo's template renders the system message inside the *last* user message, so
on every turn the previous turn's rendering stops matching where the system prompt was:
the engine recomputes the history from there. Folding the system prompt into the
conversation's first user message ourselves keeps every turn's rendered prompt an
extension of the previous one. SmolLM2's own template (ChatML, a system turn first)
is the control: there the fold should change nothing but a few tokens.

For each template, each arm (the system prompt as a system message; folded) runs on a
freshly started llama-server (SmolLM2-135M-Instruct, one slot, ``--jinja`` with the
template file from the llama.cpp sources the install keeps) and sends MTRAG
conversations through the pilot (default configuration otherwise), one conversation
after another, each turn after the previous answer (the engine's own, recorded on the
turn). Computed tokens are llama-server's ``timings.prompt_n`` (the prompt tokens it
evaluated), prefill time its ``timings.prompt_ms``. Writes the ``system-fold`` section.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from lib.sections import markdown_table, provenance, pyplot, save_figure, write_section
from rich.console import Console

from contextpilot_rag import ContextPilot, PilotConfig
from contextpilot_rag.batch.progress import rich_step_progress
from contextpilot_rag.bench.engine_workloads import EngineRequest, multiturn_workload
from contextpilot_rag.engines import install_engine, installed_engine, start_engine

SECTION = "system-fold"
TEMPLATES: tuple[tuple[str, str | None], ...] = (
    ("Mistral Nemo", "mistralai-Mistral-Nemo-Instruct-2407.jinja"),
    ("SmolLM2's own (ChatML)", None),
)
ARMS: tuple[tuple[str, bool], ...] = (("system message", False), ("folded", True))


@dataclass
class ArmResult:
    """One arm on one template: per request, its turn number (1-based), the prompt
    tokens, the tokens the engine computed and its prefill milliseconds."""

    template: str
    arm: str
    turns: list[int] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    computed: list[int] = field(default_factory=list)
    prefill_ms: list[float] = field(default_factory=list)

    def computed_share(self, turn: int) -> float:
        """Computed over prompt tokens, on the conversations' ``turn``-th turns."""
        rows = zip(self.computed, self.prompt_tokens, self.turns, strict=True)
        on_turn = [(computed, prompt) for computed, prompt, t in rows if t == turn]
        return sum(c for c, _ in on_turn) / sum(p for _, p in on_turn)

    def later(self, values: Sequence[float]) -> float:
        """The sum of ``values`` over turns after the first."""
        return sum(v for v, turn in zip(values, self.turns, strict=True) if turn > 1)


def by_conversation(requests: Sequence[EngineRequest]) -> list[EngineRequest]:
    """The requests, each conversation's turns in a row (in their first-seen order)."""
    first: dict[str | None, int] = {}
    for index, request in enumerate(requests):
        first.setdefault(request.session, index)
    return sorted(requests, key=lambda request: first[request.session])


def run_arm(
    template: tuple[str, str | None],
    arm: tuple[str, bool],
    requests: Sequence[EngineRequest],
    max_tokens: int,
    tick: Callable[[], None],
) -> ArmResult:
    """``requests`` through a pilot (``system_into_user`` as the arm says) on a fresh
    llama-server with the template."""
    name, file = template
    flags: tuple[str, ...] = ()
    if file is not None:
        installed = installed_engine("llama-server")
        path = None if installed is None else installed.layout.chat_template(file)
        if path is None:
            raise SystemExit(f"{file} is not in the llama-server install's llama.cpp sources")
        flags = ("--jinja", "--chat-template-file", str(path))
    pilot = ContextPilot(PilotConfig(system_into_user=arm[1]))
    result = ArmResult(name, arm[0])
    turn_of: dict[str | None, int] = {}
    with (
        start_engine("llama-server", max_model_len=8192, extra_args=flags) as engine,
        httpx.Client(timeout=600.0, trust_env=False) as http,
    ):
        for request in requests:
            prompt = pilot.optimize(
                list(request.blocks), request.question, conversation_id=request.session
            )
            body = {
                "model": engine.model_name,
                "messages": prompt.to_openai(),
                "max_tokens": max_tokens,
                "temperature": 0,
            }
            response = http.post(f"{engine.base_url}/chat/completions", json=body)
            response.raise_for_status()
            answer = response.json()
            timings = answer["timings"]
            turn_of[request.session] = turn_of.get(request.session, 0) + 1
            result.turns.append(turn_of[request.session])
            result.prompt_tokens.append(int(answer["usage"]["prompt_tokens"]))
            result.computed.append(int(timings["prompt_n"]))
            result.prefill_ms.append(float(timings["prompt_ms"]))
            pilot.record_answer(prompt, answer["choices"][0]["message"]["content"] or " ")
            tick()
    return result


def markdown(results: Sequence[ArmResult], facts: str) -> str:
    rows = []
    for result in results:
        plain = next(r for r in results if r.template == result.template)
        rows.append(
            (
                result.template,
                result.arm,
                f"{len(result.turns):,}",
                f"{sum(result.prompt_tokens):,}",
                f"{sum(result.computed):,}",
                f"{sum(result.computed) / sum(result.prompt_tokens):.1%}",
                f"{result.later(result.computed) / result.later(result.prompt_tokens):.1%}",
                f"{sum(result.computed) / sum(plain.computed):.2f}x",
                f"{statistics.fmean(result.prefill_ms):,.0f}",
                f"{sum(result.prefill_ms) / sum(plain.prefill_ms):.2f}x",
            )
        )
    headers = (
        "template",
        "system prompt",
        "requests",
        "prompt tokens",
        "computed",
        "computed share",
        "computed share, turns 2+",
        "computed vs system message",
        "prefill ms (mean)",
        "prefill time vs system message",
    )
    lines = [facts, "", *markdown_table(headers, rows), ""]
    lines.append(
        "*computed*: prompt tokens the engine evaluated (`timings.prompt_n`), the rest it "
        "served from its cache; *prefill ms*: its `timings.prompt_ms`. The arms' prompts "
        "differ by the folded system prompt and by the answers the engine generated for "
        "each arm's own history."
    )
    return "\n".join(lines)


def plot(results: Sequence[ArmResult], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    figure, axes = plt.subplots(1, len(TEMPLATES), figsize=(5 * len(TEMPLATES), 3.6))
    for axis, (template, _) in zip(axes, TEMPLATES, strict=True):
        for result in (r for r in results if r.template == template):
            turns = sorted(set(result.turns))
            shares = [result.computed_share(turn) for turn in turns]
            axis.plot(turns, shares, marker="o", label=result.arm)
            axis.set_xticks(turns)
        axis.set_title(template)
        axis.set_xlabel("conversation turn")
        axis.set_ylabel("share of prompt tokens computed")
        axis.set_ylim(0, 1.05)
        axis.legend()
    return save_figure(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", type=Path, help="docs file to write the section into")
    parser.add_argument("--plot", type=Path, help="PNG of the computed share per turn")
    args = parser.parse_args(argv)
    console = Console()
    if installed_engine("llama-server") is None:
        console.print("Installing llama-server with smollm2 (first run only) ...")
        install_engine("llama-server", progress=True)
    workload = multiturn_workload(
        conversations=args.conversations, turns=args.turns, seed=args.seed
    )
    requests = by_conversation(workload.requests)
    results = []
    with rich_step_progress() as progress:
        for template in TEMPLATES:
            for arm in ARMS:
                tick = progress(f"{template[0]}, {arm[0]}", len(requests))
                results.append(run_arm(template, arm, requests, args.max_tokens, tick))
    facts = (
        f"Engine: llama-server, SmolLM2-135M-Instruct, one slot, a fresh server per arm; "
        f"{args.conversations} MTRAG conversations × {args.turns} turns (the real-engine "
        f"suite's multi-turn retrieval: k=3, BM25), one conversation after another, "
        f"answers generated ({args.max_tokens} tokens, temperature 0)"
    )
    text = markdown(results, facts)
    console.print(text)
    if args.plot and plot(results, args.plot):
        text = text.replace(facts, f"{facts}\n\n![computed share per turn](img/{args.plot.name})")
    if args.write:
        command = "python benchmarks/system_fold.py " + " ".join(
            sys.argv[1:] if argv is None else argv
        )
        body = provenance(command.strip(), 1, "one run; computed tokens are the engine's count")
        write_section(args.write, SECTION, body + "\n\n" + text)
        console.print(f"wrote section {SECTION} of {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
