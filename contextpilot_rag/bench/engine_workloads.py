"""Real-text workloads for the real-engine benchmark, built from the bundled MTRAG corpus.

Each workload is a list of *arms*: the same requests turned into the chat messages
one arm sends, in the order it sends them. ``unmodified`` arms are what a user's RAG
pipeline sends without this library; ``contextpilot`` arms go through a
:class:`~contextpilot_rag.ContextPilot`. Retrieval is BM25 over the 350 passages
(:class:`~contextpilot_rag.retrievers.BM25Retriever`); a follow-up question is
retrieved with earlier questions of its session prepended (a query rewrite without an
LLM: MTRAG's follow-ups are often not standalone) — the previous one in the online
workload, all of them in the multi-turn workload.

* **online** — several users, each asking the questions of one MTRAG conversation as
  single-turn requests (no history), interleaved; unmodified: documents in retrieval
  order; contextpilot: :meth:`ContextPilot.optimize` (reorder + order note).
* **batch** — groups of questions over one shared document set (a user asking several
  questions about the same documents); each question ranks the set its own way.
  Unmodified: arrival order (groups interleaved), retrieval order per question;
  contextpilot: :meth:`ContextPilot.optimize_batch` (its execution order).
* **multi-turn** — MTRAG conversations, several at once (round robin), each turn
  retrieving ``k`` passages, each answer the engine's own. Two application patterns,
  each with its own unmodified arm: ``unmodified`` keeps every turn's documents in the
  conversation (its user message, as agents keep tool results and chat apps that put
  the context in the question do; the pilot with reorder, dedup and notes off), and
  ``contextpilot`` de-duplicates against that history and appends only new documents;
  ``unmodified, Q&A history`` is LangChain's conversational-RAG pattern (this turn's
  documents in the system message, then only the questions and answers so far), and
  ``contextpilot, reorder only`` keeps that pattern with the documents in the pilot's
  order (what ``ContextPilotRetriever`` returns to such a chain).

All arms of a workload share the system prompt, questions, answers and documents.
Pure functions of their arguments.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from ..blocks import ContextBlock
from ..errors import ConfigError
from ..experiment import baseline_config
from ..pilot import ContextPilot, PilotConfig
from ..prompt import Prompt
from ..retrievers import BM25Retriever
from ..tokenizers import Tokenizer
from .corpus import Conversation, MtragCorpus, Turn, load_mtrag

__all__ = [
    "QA_HISTORY",
    "REORDER_ONLY",
    "SYSTEM",
    "Arm",
    "EngineRequest",
    "EngineWorkload",
    "FixedArm",
    "batch_workload",
    "multiturn_workload",
    "online_workload",
    "unmodified_messages",
]

Messages = Sequence[Mapping[str, str]]

QA_HISTORY = "unmodified, Q&A history"
REORDER_ONLY = "contextpilot, reorder only"

SYSTEM = (
    "You are a helpful assistant. Answer the user's question from the context documents. "
    "If they do not contain the answer, say so."
)
"""The system prompt of every arm (the user's own; the pilot is given it)."""


class Arm(Protocol):
    """One way of sending a workload's requests, in send order. A request's messages
    may depend on the answers to earlier ones (multi-turn): the runner calls
    :meth:`messages` for request ``i``, sends it, then :meth:`answered` with the
    engine's answer, before asking for request ``i + 1``."""

    @property
    def name(self) -> str: ...

    @property
    def max_tokens(self) -> int:
        """Tokens to generate per request (1 when only time to first token matters)."""
        ...

    def __len__(self) -> int: ...

    def messages(self, i: int) -> Messages: ...

    def answered(self, i: int, answer: str) -> None: ...


@dataclass(frozen=True)
class FixedArm:
    """An arm whose prompts do not depend on answers (single-turn, batch)."""

    name: str
    prompts: tuple[Messages, ...]
    max_tokens: int = 1

    def __len__(self) -> int:
        return len(self.prompts)

    def messages(self, i: int) -> Messages:
        return self.prompts[i]

    def answered(self, i: int, answer: str) -> None:
        return None


@dataclass(frozen=True)
class EngineWorkload:
    name: str
    description: str
    arms: tuple[Arm, ...]
    requests: tuple[EngineRequest, ...] = ()
    """The requests in arrival order (what the arms send, before any reordering)."""
    pairs: tuple[tuple[str, str], ...] = (("unmodified", "contextpilot"),)
    """(unmodified arm, optimized arm) compared with each other; the first pair is the
    one the targets are stated on."""

    def arm(self, name: str) -> Arm:
        return next(arm for arm in self.arms if arm.name == name)


@dataclass(frozen=True)
class EngineRequest:
    """One request of a workload: its session (``None``: none), the documents the
    retriever returned for ``query`` (the question, with earlier questions of the
    session prepended), the question and MTRAG's reference answer."""

    session: str | None
    blocks: tuple[ContextBlock, ...]
    question: str
    answer: str
    query: str = ""


def unmodified_messages(
    blocks: Sequence[ContextBlock],
    question: str,
    history: Sequence[tuple[str, str]] = (),
    *,
    note: str | None = None,
) -> list[dict[str, str]]:
    """What a LangChain RAG chain sends: the documents (texts separated by blank lines)
    in the system message (``note`` after them), the chat history of (question,
    answer) pairs, the question."""
    context = "\n\n".join(block.text for block in blocks)
    system = f"{SYSTEM}\n\nContext:\n\n{context}" + (f"\n\n{note}" if note else "")
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    for asked, answered in history:
        messages += [{"role": "user", "content": asked}, {"role": "assistant", "content": answered}]
    messages.append({"role": "user", "content": question})
    return messages


def _blocks(corpus: MtragCorpus) -> list[ContextBlock]:
    return [ContextBlock(p.text, id=p.id) for p in corpus.passages]


def _retriever(corpus: MtragCorpus) -> BM25Retriever:
    return BM25Retriever(_blocks(corpus))


def _check(name: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")


def _conversations(corpus: MtragCorpus, count: int, turns: int, seed: int) -> list[Conversation]:
    eligible = [c for c in corpus.conversations if len(c.turns) >= turns]
    if len(eligible) < count:
        raise ConfigError(f"only {len(eligible)} MTRAG conversations have {turns} turns")
    return random.Random(seed).sample(eligible, count)


def _session_requests(
    retriever: BM25Retriever,
    session: str,
    turns: Sequence[Turn],
    k: int,
    history: int | None = 1,
) -> list[EngineRequest]:
    """One request per turn; the BM25 query is the turn's question after the
    ``history`` questions before it in the session (``None``: all of them)."""
    requests: list[EngineRequest] = []
    asked: list[str] = []
    for turn in turns:
        earlier = asked[max(0, len(asked) - history) :] if history is not None else asked
        query = " ".join([*earlier, turn.question]).strip()
        blocks = tuple(retriever.retrieve(query, k=k))
        requests.append(EngineRequest(session, blocks, turn.question, turn.answer, query))
        asked.append(turn.question)
    return requests


def _query_words(history: int | None) -> str:
    if history is None:
        return "query: the conversation's questions so far"
    return f"query: the question after up to {history} earlier ones"


def _round_robin(sessions: Sequence[Sequence[EngineRequest]]) -> list[EngineRequest]:
    order: list[EngineRequest] = []
    for position in range(max(len(s) for s in sessions)):
        order += [s[position] for s in sessions if position < len(s)]
    return order


def _pilot(tokenizer: Tokenizer | None, config: PilotConfig | None = None) -> ContextPilot:
    return ContextPilot(config or PilotConfig(), tokenizer=tokenizer)


def online_workload(
    *,
    topics: int = 2,
    users_per_topic: int = 6,
    questions: int = 5,
    k: int = 8,
    seed: int = 0,
    corpus: MtragCorpus | None = None,
    tokenizer: Tokenizer | None = None,
) -> EngineWorkload:
    """``topics`` MTRAG conversations, each researched by ``users_per_topic`` users who
    ask ``questions`` of its questions (a random subset, in a random order) as
    single-turn requests; the users' sessions interleaved round robin."""
    for name, value in (("topics", topics), ("users_per_topic", users_per_topic)):
        _check(name, value, 1)
    _check("questions", questions, 1)
    _check("k", k, 1)
    corpus = corpus or load_mtrag()
    retriever = _retriever(corpus)
    rng = random.Random(seed)
    sessions = []
    for conversation in _conversations(corpus, topics, questions, seed):
        for user in range(users_per_topic):
            asked = rng.sample(list(conversation.turns), questions)
            session = f"{conversation.id}/{user}"
            sessions.append(_session_requests(retriever, session, asked, k))
    rng.shuffle(sessions)
    requests = _round_robin(sessions)
    pilot = _pilot(tokenizer)
    ours = tuple(pilot.optimize(r.blocks, r.question, system=SYSTEM).messages for r in requests)
    plain = tuple(unmodified_messages(r.blocks, r.question) for r in requests)
    return EngineWorkload(
        "online",
        f"{topics} topics × {users_per_topic} users × {questions} questions (MTRAG), k={k}, "
        "BM25, single-turn, interleaved",
        (FixedArm("unmodified", plain), FixedArm("contextpilot", ours)),
        tuple(requests),
    )


def batch_workload(
    *,
    groups: int = 5,
    questions: int = 4,
    k: int = 4,
    seed: int = 0,
    corpus: MtragCorpus | None = None,
    tokenizer: Tokenizer | None = None,
) -> EngineWorkload:
    """``groups`` document sets of ``k`` passages (the passages BM25 finds for all of a
    conversation's first ``questions`` questions), each asked those questions, which
    rank the set their own way; arrival order shuffled across groups."""
    for name, value, low in (("groups", groups, 1), ("questions", questions, 1), ("k", k, 2)):
        _check(name, value, low)
    corpus = corpus or load_mtrag()
    retriever = _retriever(corpus)
    requests: list[EngineRequest] = []
    for conversation in _conversations(corpus, groups, questions, seed):
        asked = [turn.question for turn in conversation.turns[:questions]]
        shared = retriever.retrieve(" ".join(asked), k=k)
        local = BM25Retriever(shared)
        for question in asked:
            ranked = local.retrieve(question, k=k)
            ranked += [b for b in shared if b.id not in {r.id for r in ranked}]
            requests.append(EngineRequest(conversation.id, tuple(ranked), question, "", question))
    random.Random(seed).shuffle(requests)
    pilot = _pilot(tokenizer)
    planned = pilot.optimize_batch([(r.blocks, r.question) for r in requests], system=SYSTEM)
    plain = tuple(unmodified_messages(r.blocks, r.question) for r in requests)
    return EngineWorkload(
        "batch",
        f"{groups} document sets × {questions} questions (MTRAG), k={k}, shuffled arrival",
        (
            FixedArm("unmodified", plain),
            FixedArm("contextpilot", tuple(prompt.messages for prompt in planned)),
        ),
        tuple(requests),
    )


class _Unmodified:
    """LangChain's conversational RAG: documents in the system message, then the
    questions and answers so far (each session's own), then the question; with a
    ``pilot``, the documents in its order (and its order note after them)."""

    def __init__(
        self,
        name: str,
        requests: Sequence[EngineRequest],
        max_tokens: int,
        pilot: ContextPilot | None = None,
    ) -> None:
        self.name = name
        self.max_tokens = max_tokens
        self._requests = requests
        self._pilot = pilot
        self._history: dict[str | None, list[tuple[str, str]]] = {}

    def __len__(self) -> int:
        return len(self._requests)

    def messages(self, i: int) -> Messages:
        r = self._requests[i]
        history = self._history.get(r.session, ())
        if self._pilot is None:
            return unmodified_messages(r.blocks, r.question, history)
        prompt = self._pilot.optimize(r.blocks, r.question)
        return unmodified_messages(prompt.blocks, r.question, history, note=prompt.order_note)

    def answered(self, i: int, answer: str) -> None:
        r = self._requests[i]
        self._history.setdefault(r.session, []).append((r.question, answer))


class _Piloted:
    """Each turn through a pilot (its config decides reorder, dedup and notes); the
    engine's answer recorded on the turn."""

    def __init__(
        self, name: str, requests: Sequence[EngineRequest], pilot: ContextPilot, max_tokens: int
    ) -> None:
        self.name = name
        self.max_tokens = max_tokens
        self._requests = requests
        self._pilot = pilot
        self._prompts: dict[int, Prompt] = {}

    def __len__(self) -> int:
        return len(self._requests)

    def messages(self, i: int) -> Messages:
        r = self._requests[i]
        prompt = self._pilot.optimize(
            r.blocks, r.question, conversation_id=r.session, system=SYSTEM
        )
        self._prompts[i] = prompt
        return prompt.messages

    def answered(self, i: int, answer: str) -> None:
        self._pilot.record_answer(self._prompts.pop(i), answer or " ")


def multiturn_workload(
    *,
    conversations: int = 4,
    turns: int = 5,
    k: int = 3,
    max_tokens: int = 32,
    seed: int = 0,
    query_history: int | None = None,
    corpus: MtragCorpus | None = None,
    tokenizer: Tokenizer | None = None,
) -> EngineWorkload:
    """``conversations`` MTRAG conversations of their first ``turns`` turns, round robin;
    each turn's answer is the engine's own (``max_tokens`` generated), recorded in the
    history as a chat application does. A turn retrieves with its question after the
    conversation's earlier questions (``query_history`` of them; ``None``, the default:
    all), the history-aware query a chat application without an LLM rewriter uses
    (MTRAG's follow-ups are often not standalone). The defaults keep the longest prompt
    (the unmodified arm's, which repeats re-retrieved documents) within an 8k context
    on the first seed."""
    for name, value in (("conversations", conversations), ("turns", turns), ("k", k)):
        _check(name, value, 1)
    _check("max_tokens", max_tokens, 1)
    if query_history is not None:
        _check("query_history", query_history, 0)
    corpus = corpus or load_mtrag()
    retriever = _retriever(corpus)
    sessions = [
        _session_requests(retriever, c.id, c.turns[:turns], k, query_history)
        for c in _conversations(corpus, conversations, turns, seed)
    ]
    requests = _round_robin(sessions)
    keeps = replace(baseline_config(), system_prompt=SYSTEM)
    return EngineWorkload(
        "multi-turn",
        f"{conversations} MTRAG conversations × {turns} turns, k={k}, BM25 "
        f"({_query_words(query_history)}), round robin, "
        f"answers generated ({max_tokens} tokens)",
        (
            _Piloted("unmodified", requests, _pilot(tokenizer, keeps), max_tokens),
            _Piloted("contextpilot", requests, _pilot(tokenizer), max_tokens),
            _Unmodified(QA_HISTORY, requests, max_tokens),
            _Unmodified(REORDER_ONLY, requests, max_tokens, _pilot(tokenizer)),
        ),
        tuple(requests),
        pairs=(("unmodified", "contextpilot"), (QA_HISTORY, REORDER_ONLY)),
    )
