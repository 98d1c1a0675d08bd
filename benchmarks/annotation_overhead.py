"""Prompt tokens that block labels and notes add, on real RAG documents.

    python benchmarks/annotation_overhead.py --write docs/benchmarks.md

Documents: the MTRAG human subset (``../shared/data/mtrag_human``: 350 passages with long
ids such as ``837407666_1762-2394-0-632``, 20 conversations of 5-12 turns) and the
MultiHopRAG evidence facts (``../shared/data/multihoprag``: 438 one-sentence facts with
content-hash ids). Workloads, one stream per seed:

- **MTRAG single-turn**: 200 requests of k = 4..8 passages drawn at random from the 350
  (in random relevance order), each with a question from the conversations' user turns;
  one pilot serves the stream, so reordering meets shared prefixes and writes order notes.
- **MTRAG multi-turn**: the 20 conversations turn by turn: each turn's reference passages,
  then passages drawn to reach k = 4..8 (half of them, where there are any, from the
  conversation's earlier turns, so de-duplication fires), the turn's question, and the
  reference answer recorded as the assistant turn.
- **MultiHopRAG facts**: 200 requests of a query's evidence facts plus random other facts
  to reach k = 4..8, shuffled, with the query's question.

``--requests`` and ``--conversations`` shrink the streams (for a smoke run).

The baseline is the prompt a user writes without the pilot: the same system prompt, the
same documents' texts (stripped) separated by blank lines with no labels, header or notes,
then the question; for a conversation, the same history written the same way. Tokens are
the message contents' tokens under the default tokenizer (cl100k, offline); chat-template
tokens are equal on both sides and left out, which only raises the ratios. Overhead is
pilot tokens / baseline tokens - 1 over a seed's whole stream (every turn's full prompt,
history included); the table gives its min / median / max over the seeds and the largest
single prompt's. With de-duplication on, a multi-turn prompt drops repeated passages: that
row is a saving (negative), not an overhead. Writes the ``annotation-overhead`` section.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lib.sections import markdown_table, provenance, write_or_print

from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig
from contextpilot_rag.tokenizers import Tokenizer, default_tokenizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MTRAG = DATA / "mtrag_human" / "reference_subset_with_human_evaluations.json"
MULTIHOP = DATA / "multihoprag"
SECTION = "annotation-overhead"
TARGET = 0.05
K_RANGE = (4, 8)
Messages = Sequence[Mapping[str, str]]


@dataclass(frozen=True)
class Turn:
    blocks: tuple[ContextBlock, ...]
    query: str
    answer: str | None = None


Stream = list[tuple[str | None, Turn]]  # (conversation id or None, turn), in order


@dataclass(frozen=True)
class Scale:
    requests: int = 200  # per single-turn stream
    conversations: int = 20  # of the MTRAG subset's 20


@dataclass(frozen=True)
class Data:
    passages: tuple[ContextBlock, ...]
    questions: tuple[str, ...]
    conversations: dict[str, list[tuple[tuple[str, ...], str, str]]]  # id → (contexts, q, a)
    facts: tuple[ContextBlock, ...]
    fact_queries: tuple[tuple[str, tuple[ContextBlock, ...]], ...]


def load() -> Data:
    mtrag = json.loads(MTRAG.read_text(encoding="utf-8"))
    passages = tuple(ContextBlock(doc["text"], id=doc["document_id"]) for doc in mtrag["documents"])
    turns: dict[str, list[tuple[int, tuple[str, ...], str, str]]] = defaultdict(list)
    for task in mtrag["tasks"]:
        conversation, turn = task["task_id"].split("<::>")
        contexts = tuple(context["document_id"] for context in task["contexts"])
        turns[conversation].append(
            (int(turn), contexts, task["input"][-1]["text"], task["targets"][0]["text"])
        )
    conversations = {
        name: [(contexts, q, a) for _, contexts, q, a in sorted(rows)]
        for name, rows in sorted(turns.items())
    }
    questions = tuple(q for rows in conversations.values() for _, q, _ in rows)
    truth = json.loads((MULTIHOP / "ground_truth_500.json").read_text(encoding="utf-8"))
    queries = json.loads((MULTIHOP / "queries_500.json").read_text(encoding="utf-8"))
    facts: dict[str, ContextBlock] = {}
    fact_queries = []
    for query in queries["queries"]:
        evidence = tuple(
            facts.setdefault(e["fact"], ContextBlock(e["fact"]))
            for e in truth[query["id"]]["evidence_list"]
        )
        if evidence:
            fact_queries.append((query["question"], evidence))
    return Data(passages, questions, conversations, tuple(facts.values()), tuple(fact_queries))


def single_turn(data: Data, seed: int, scale: Scale) -> Stream:
    rng = random.Random(seed)
    stream: Stream = []
    for _ in range(scale.requests):
        blocks = tuple(rng.sample(data.passages, rng.randint(*K_RANGE)))
        stream.append((None, Turn(blocks, rng.choice(data.questions))))
    return stream


def multi_turn(data: Data, seed: int, scale: Scale) -> Stream:
    rng = random.Random(seed)
    by_id = {block.id: block for block in data.passages}
    stream: Stream = []
    for name, rows in list(data.conversations.items())[: scale.conversations]:
        shown: list[ContextBlock] = []
        for contexts, question, answer in rows:
            blocks = [by_id[block_id] for block_id in contexts]
            k = max(len(blocks), rng.randint(*K_RANGE))
            while len(blocks) < k:
                earlier = [block for block in shown if block not in blocks]
                pool = earlier if earlier and rng.random() < 0.5 else data.passages
                block = rng.choice(pool)
                if block not in blocks:
                    blocks.append(block)
            stream.append((name, Turn(tuple(blocks), question, answer)))
            shown.extend(block for block in blocks if block not in shown)
    return stream


def facts(data: Data, seed: int, scale: Scale) -> Stream:
    rng = random.Random(seed)
    stream: Stream = []
    for _ in range(scale.requests):
        query, evidence = rng.choice(data.fact_queries)
        blocks = list(evidence)
        k = max(len(blocks), rng.randint(*K_RANGE))
        while len(blocks) < k:
            fact = rng.choice(data.facts)
            if fact not in blocks:
                blocks.append(fact)
        rng.shuffle(blocks)
        stream.append((None, Turn(tuple(blocks), query)))
    return stream


WORKLOADS = {
    "MTRAG single-turn": single_turn,
    "MTRAG multi-turn": multi_turn,
    "MultiHopRAG facts": facts,
}
TARGETED = ("MTRAG single-turn", "MTRAG multi-turn")  # passages; facts are one sentence


@dataclass(frozen=True)
class Arm:
    name: str
    config: PilotConfig
    targeted: bool  # the target applies: default labels, nothing removed by dedup
    conversations_only: bool = False


ARMS = (
    Arm("reorder off, dedup off", PilotConfig(reorder=False, dedup=False), True),
    Arm("reorder on, dedup off", PilotConfig(dedup=False), True),
    Arm(
        'reorder on, dedup off, `label_style="id"`',
        PilotConfig(dedup=False, label_style="id"),
        False,
    ),
    Arm("reorder on, dedup on (a saving)", PilotConfig(), False, conversations_only=True),
)


@dataclass(frozen=True)
class Result:
    workload: str
    arm: Arm
    per_seed: tuple[float, ...]  # overhead over each seed's whole stream
    worst_prompt: float  # the largest overhead of one prompt, over all seeds


def tokens(tokenizer: Tokenizer, messages: Messages) -> int:
    return sum(tokenizer.count(message["content"]) for message in messages)


def baseline(stream: Stream, system: str, question_template: str) -> Iterator[Messages]:
    """The messages a user writes for each request of ``stream``, without the pilot."""
    history: dict[str, list[dict[str, str]]] = defaultdict(list)
    for conversation, turn in stream:
        texts = "".join(block.text.strip() + "\n\n" for block in turn.blocks)
        user = {"role": "user", "content": texts + question_template.format(query=turn.query)}
        past = history[conversation] if conversation is not None else []
        yield [{"role": "system", "content": system}, *past, user]
        if conversation is not None:
            past.append(user)
            past.append({"role": "assistant", "content": turn.answer or ""})


def piloted(stream: Stream, config: PilotConfig, tokenizer: Tokenizer) -> Iterator[Messages]:
    pilot = ContextPilot(config, tokenizer=tokenizer)
    for conversation, turn in stream:
        prompt = pilot.optimize(turn.blocks, turn.query, conversation_id=conversation)
        yield prompt.messages
        if conversation is not None and turn.answer is not None:
            pilot.record_answer(prompt, turn.answer)


def measure(stream: Stream, config: PilotConfig, tokenizer: Tokenizer) -> tuple[float, float]:
    """(overhead over the whole stream, largest overhead of one prompt)."""
    system = config.system_prompt or ""
    pairs = zip(
        piloted(stream, config, tokenizer),
        baseline(stream, system, config.question_template),
        strict=True,
    )
    counts = [(tokens(tokenizer, ours), tokens(tokenizer, theirs)) for ours, theirs in pairs]
    total = sum(ours for ours, _ in counts) / sum(theirs for _, theirs in counts) - 1
    return total, max(ours / theirs - 1 for ours, theirs in counts)


def run(data: Data, seeds: Sequence[int], scale: Scale, tokenizer: Tokenizer) -> list[Result]:
    results = []
    for workload, build in WORKLOADS.items():
        streams = [build(data, seed, scale) for seed in seeds]
        conversational = any(conversation for stream in streams for conversation, _ in stream)
        for arm in ARMS:
            if arm.conversations_only and not conversational:
                continue
            measured = [measure(stream, arm.config, tokenizer) for stream in streams]
            per_seed = tuple(total for total, _ in measured)
            results.append(Result(workload, arm, per_seed, max(w for _, w in measured)))
    return results


def mean_document_tokens(data: Data, tokenizer: Tokenizer) -> dict[str, float]:
    passages = statistics.mean(tokenizer.count(block.text) for block in data.passages)
    facts = statistics.mean(tokenizer.count(block.text) for block in data.facts)
    return {"MTRAG passages": passages, "MultiHopRAG facts": facts}


def _pct(value: float) -> str:
    return f"{value:+.1%}"


def _row(result: Result) -> list[str]:
    values = result.per_seed
    spread = (min(values), statistics.median(values), max(values))
    return [
        result.workload,
        result.arm.name,
        " / ".join(map(_pct, spread)),
        _pct(result.worst_prompt),
    ]


def markdown(
    results: Sequence[Result], sizes: Mapping[str, float], argv: Sequence[str], seeds: int
) -> str:
    checked = [max(r.per_seed) for r in results if r.arm.targeted and r.workload in TARGETED]
    met = "yes" if max(checked) <= TARGET else "no"
    headers = [
        "workload",
        "pilot (annotate on)",
        "overhead over the plain prompt, min / median / max over seeds",
        "largest single prompt",
    ]
    documents = ", ".join(f"{name} {tokens:.0f}" for name, tokens in sizes.items())
    return "\n".join(
        [
            "## Prompt tokens of labels and notes (`benchmarks/annotation_overhead.py`)",
            "",
            provenance(
                "python benchmarks/annotation_overhead.py " + " ".join(argv),
                seeds,
                "deterministic token counts; min / median / max are over the seeds' streams",
            ),
            "",
            *markdown_table(headers, [_row(result) for result in results]),
            "",
            f"Mean tokens per document: {documents}.",
            "",
            f"Target (issue 20): labels and notes add at most {TARGET:.0%} prompt tokens on the "
            f"MTRAG workloads (worst seed, default labels, dedup off): {met} "
            f"(worst {_pct(max(checked))}).",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="streams per workload (default 5)")
    parser.add_argument("--requests", type=int, default=200, help="per single-turn stream")
    parser.add_argument("--conversations", type=int, default=20, help="MTRAG conversations")
    parser.add_argument("--write", type=Path)
    args = parser.parse_args(argv)
    seeds = list(range(max(1, args.seeds)))
    scale = Scale(max(1, args.requests), max(1, args.conversations))
    data, tokenizer = load(), default_tokenizer()
    results = run(data, seeds, scale, tokenizer)
    text = markdown(results, mean_document_tokens(data, tokenizer), argv, len(seeds)) + "\n"
    write_or_print(text, SECTION, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
