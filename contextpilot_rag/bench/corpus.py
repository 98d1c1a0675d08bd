"""A real RAG corpus shipped with the package: the MTRAG human-evaluated subset.

The demo and the real-engine benchmark need text an engine tokenizes like real
documents and conversations whose later turns follow earlier ones. The bundle
``contextpilot_rag/data/mtrag_human.json.gz`` holds, from IBM's MTRAG benchmark
(``IBM/mt-rag-benchmark`` @ cc5b1d48, ``mtrag-human/evaluations/
reference_subset_with_human_evaluations.json``, Apache-2.0; see
``contextpilot_rag/data/NOTICE``):

* the 350 passages of its four corpora (ClapNQ, FiQA, Govt, IBM Cloud), ~1.5k
  characters each, with their MTRAG document ids and titles;
* its 20 conversations of 5–12 turns: each turn's user question, the reference
  answer, the ids of the passages MTRAG's retriever gave for that turn and MTRAG's
  answerability label for it.

:func:`build_bundle` writes the bundle from the upstream file (``../shared/data`` in
a source checkout); :func:`load_mtrag` reads it. Both are pure functions of their
input: the bundle is byte-stable (sorted keys, fixed gzip mtime).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError

__all__ = [
    "BUNDLE_NAME",
    "Conversation",
    "MtragCorpus",
    "Passage",
    "Turn",
    "build_bundle",
    "load_mtrag",
]

BUNDLE_NAME = "mtrag_human.json.gz"
ATTRIBUTION = (
    "MTRAG human-evaluated subset, IBM/mt-rag-benchmark @ cc5b1d48 "
    "(mtrag-human/evaluations/reference_subset_with_human_evaluations.json), Apache-2.0. "
    "Katsis et al., 'MTRAG: A Multi-Turn Conversational Benchmark for Evaluating "
    "Retrieval-Augmented Generation Systems', 2025."
)


@dataclass(frozen=True)
class Passage:
    """One corpus passage: MTRAG's document id, its title and its text."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Turn:
    """One user turn: the question, MTRAG's reference answer, the ids of the
    passages its retriever returned for it (best first) and MTRAG's answerability
    label (``ANSWERABLE``, ``PARTIAL``, ``UNANSWERABLE`` or ``CONVERSATIONAL``; the
    unanswerable and conversational turns have no passages)."""

    question: str
    answer: str
    context_ids: tuple[str, ...]
    answerability: str = "ANSWERABLE"


@dataclass(frozen=True)
class Conversation:
    id: str
    collection: str
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class MtragCorpus:
    passages: tuple[Passage, ...]
    conversations: tuple[Conversation, ...]
    attribution: str

    def passage(self, passage_id: str) -> Passage:
        return self._by_id[passage_id]

    @property
    def _by_id(self) -> Mapping[str, Passage]:
        return _index(self.passages)


@lru_cache(maxsize=4)
def _index(passages: tuple[Passage, ...]) -> Mapping[str, Passage]:
    return {passage.id: passage for passage in passages}


def _upstream_conversations(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_conversation: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for task in tasks:
        conversation, turn = str(task["task_id"]).split("<::>")
        by_conversation[conversation].append((int(turn), task))
    conversations = []
    for conversation_id in sorted(by_conversation):
        ordered = sorted(by_conversation[conversation_id], key=lambda item: item[0])
        turns = []
        for _, task in ordered:
            questions = [m["text"] for m in task["input"] if m["speaker"] == "user"]
            answers = [t["text"] for t in task.get("targets", []) if t.get("text")]
            turns.append(
                {
                    "question": questions[-1],
                    "answer": answers[0] if answers else "",
                    "contexts": [c["document_id"] for c in task.get("contexts", [])],
                    "answerability": (task.get("Answerability") or ["ANSWERABLE"])[0],
                }
            )
        conversations.append(
            {
                "id": conversation_id,
                "collection": str(ordered[0][1].get("Collection", "")),
                "turns": turns,
            }
        )
    return conversations


def build_bundle(upstream: Path, out: Path) -> Path:
    """Write the bundle from MTRAG's ``reference_subset_with_human_evaluations.json``."""
    data = json.loads(upstream.read_text(encoding="utf-8"))
    bundle = {
        "attribution": ATTRIBUTION,
        "passages": [
            {"id": d["document_id"], "title": d.get("title", ""), "text": d["text"]}
            for d in sorted(data["documents"], key=lambda d: d["document_id"])
        ],
        "conversations": _upstream_conversations(data["tasks"]),
    }
    raw = json.dumps(bundle, sort_keys=True, ensure_ascii=False).encode("utf-8")
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as file, gzip.GzipFile(fileobj=file, mode="wb", mtime=0) as packed:
        packed.write(raw)
    return out


def load_mtrag(path: Path | None = None) -> MtragCorpus:
    """The bundled corpus (or a bundle at ``path``)."""
    if path is None:
        raw = resources.files("contextpilot_rag.data").joinpath(BUNDLE_NAME).read_bytes()
    else:
        raw = path.read_bytes()
    try:
        data = json.loads(gzip.decompress(raw))
        passages = tuple(Passage(p["id"], p["title"], p["text"]) for p in data["passages"])
        conversations = tuple(
            Conversation(
                c["id"],
                c["collection"],
                tuple(
                    Turn(
                        t["question"],
                        t["answer"],
                        tuple(t["contexts"]),
                        t.get("answerability", "ANSWERABLE"),
                    )
                    for t in c["turns"]
                ),
            )
            for c in data["conversations"]
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidInputError(f"not an MTRAG bundle: {exc!r}") from exc
    return MtragCorpus(passages, conversations, str(data.get("attribution", "")))
