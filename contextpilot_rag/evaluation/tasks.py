"""Evaluation tasks: a question, its documents, its history, its reference answers.

Two sources. :func:`mtrag_tasks` turns the bundled MTRAG human subset
(:func:`~contextpilot_rag.bench.corpus.load_mtrag`) into its 159 tasks, one per turn of
its 20 conversations. A task's documents are, with ``contexts="bm25"`` (the default),
the ``top_k`` passages BM25 finds among the 350 for the turn's question with the
previous question of the conversation prepended (the online engine benchmark's retrieval:
follow-ups are often not standalone); with ``contexts="reference"``, the turn's
*reference passages* (those MTRAG's annotators answered from, none for its
unanswerable turns), looked up by document id. Retrieval is the default because the
pilot has something to do: a later turn's reference passages seldom repeat an earlier
turn's, or another conversation's, so with them reordering and de-duplication leave
most prompts as they were and the check says little (``docs/eval.md``).
:func:`load_jsonl_tasks` reads the user's own file, one task per line::

    {"conversation_id"?, "turn"?, "question", "documents": [str | {"id"?, "text"}],
     "history"?: [{"role", "content"}], "reference"?: str | [str], "answerable"?: bool}

Tasks of one ``conversation_id`` are replayed turn by turn (``turn`` order, else file
order): each later turn carries the earlier ones as history, with the earlier turn's
first reference as the assistant's answer, so every arm sees the same history.
``history`` is for a task outside any conversation: messages sent, unchanged, before
its question. Every line is validated before anything runs; all problems are reported
together, each with its line number (:class:`TaskFileError`).

Invariant of a task list: the tasks of a conversation are adjacent and in turn order,
and every turn but a conversation's last has a reference answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .._json_lines import json_object
from ..blocks import ContextBlock, check_encodable
from ..errors import ConfigError, InvalidInputError

__all__ = [
    "CONTEXTS",
    "MTRAG",
    "EvalTask",
    "HistoryMessage",
    "TaskFileError",
    "limit_tasks",
    "load_jsonl_tasks",
    "load_tasks",
    "mtrag_tasks",
    "parse_jsonl_tasks",
]

MTRAG = "mtrag"
"""The name that selects the bundled MTRAG tasks."""
CONTEXTS = ("bm25", "reference")
"""Where the documents of an MTRAG task come from."""

_FIELDS = frozenset(
    {"conversation_id", "turn", "question", "documents", "history", "reference", "answerable"}
)
_ROLES = ("user", "assistant")
_MAX_SHOWN_PROBLEMS = 20


@dataclass(frozen=True)
class HistoryMessage:
    role: str
    content: str


@dataclass(frozen=True)
class EvalTask:
    """One question to answer. ``answerable`` is ``None`` when the task does not say
    (MTRAG's conversational turns, a JSONL line without it); ``references`` may be
    empty (no F1 or ROUGE-L then)."""

    task_id: str
    question: str
    documents: tuple[ContextBlock, ...]
    references: tuple[str, ...] = ()
    answerable: bool | None = None
    conversation_id: str | None = None
    turn: int | None = None
    history: tuple[HistoryMessage, ...] = ()

    @property
    def cluster(self) -> str:
        """What the bootstrap resamples: turns of one conversation go together."""
        return self.conversation_id if self.conversation_id is not None else self.task_id


class TaskFileError(InvalidInputError):
    """A task file has invalid lines. ``problems`` lists ``(line number, message)``
    for every invalid line (line numbers start at 1)."""

    def __init__(self, path: str, problems: Sequence[tuple[int, str]]) -> None:
        self.path = path
        self.problems = tuple(problems)
        shown = [f"{path}:{line}: {message}" for line, message in problems[:_MAX_SHOWN_PROBLEMS]]
        more = len(problems) - len(shown)
        if more > 0:
            shown.append(f"... and {more} more")
        super().__init__("invalid task file:\n" + "\n".join(shown))


# -- MTRAG -------------------------------------------------------------------------


def mtrag_tasks(
    corpus: Any = None, *, contexts: str = "bm25", top_k: int = 3, limit: int | None = None
) -> tuple[EvalTask, ...]:
    """The bundled MTRAG human subset as tasks, conversation by conversation (the
    first ``limit`` of them), with ``contexts`` (``"bm25"`` or ``"reference"``, see
    the module docstring).
    ``answerable``: ``ANSWERABLE`` and ``PARTIAL`` turns are answerable,
    ``UNANSWERABLE`` ones are not, ``CONVERSATIONAL`` ones ("thanks!") say nothing."""
    from ..bench.corpus import load_mtrag

    if contexts not in CONTEXTS:
        raise ConfigError(f"contexts must be one of {CONTEXTS}, got {contexts!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ConfigError(f"top_k must be an integer >= 1, got {top_k!r}")
    _check_limit(limit)
    corpus = corpus or load_mtrag()
    retrieve = _bm25(corpus, top_k) if contexts == "bm25" else _reference_passages(corpus)
    turns = [(c, n, t) for c in corpus.conversations for n, t in enumerate(c.turns, start=1)]
    tasks = []
    for conversation, number, turn in turns[:limit]:
        previous = conversation.turns[number - 2].question if number > 1 else ""
        tasks.append(
            EvalTask(
                task_id=f"{conversation.id}<::>{number}",
                question=turn.question,
                documents=retrieve(f"{previous} {turn.question}".strip(), turn.context_ids),
                references=(turn.answer,) if turn.answer else (),
                answerable=_mtrag_answerable(turn.answerability),
                conversation_id=conversation.id,
                turn=number,
            )
        )
    return tuple(tasks)


_Documents = Callable[[str, Sequence[str]], tuple[ContextBlock, ...]]
"""``(query, reference passage ids) -> documents`` of one MTRAG turn."""


def _bm25(corpus: Any, top_k: int) -> _Documents:
    from ..retrievers import BM25Retriever

    retriever = BM25Retriever([ContextBlock(p.text, id=p.id) for p in corpus.passages])
    return lambda query, _: tuple(retriever.retrieve(query, k=top_k))


def _reference_passages(corpus: Any) -> _Documents:
    def documents(_: str, ids: Sequence[str]) -> tuple[ContextBlock, ...]:
        return tuple(ContextBlock(corpus.passage(i).text, id=i) for i in ids)

    return documents


def _mtrag_answerable(label: str) -> bool | None:
    if label in ("ANSWERABLE", "PARTIAL"):
        return True
    if label == "UNANSWERABLE":
        return False
    return None


# -- JSONL -------------------------------------------------------------------------


class _LineError(Exception):
    pass


def load_jsonl_tasks(path: Path | str) -> tuple[EvalTask, ...]:
    """The tasks of a JSONL file (blank lines skipped), conversations replayed in turn
    order. Raises :class:`TaskFileError` listing every invalid line, and
    :class:`~contextpilot_rag.errors.InvalidInputError` for an unreadable file."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"cannot read task file {str(path)!r}: {exc}") from exc
    return parse_jsonl_tasks(_jsonl_lines(text), source=str(path))


def _jsonl_lines(text: str) -> list[str]:
    """The lines of a JSON Lines text: split at ``\n`` only (a CRLF's ``\r`` dropped),
    never at the U+2028, U+0085 … that ``str.splitlines`` also takes for line ends and
    JSON allows unescaped inside a string."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def parse_jsonl_tasks(lines: Iterable[str], *, source: str = "<tasks>") -> tuple[EvalTask, ...]:
    """:func:`load_jsonl_tasks` on lines already read."""
    parsed: list[tuple[int, EvalTask]] = []
    problems: list[tuple[int, str]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            parsed.append((number, _task_of_line(line, number)))
        except _LineError as exc:
            problems.append((number, str(exc)))
    if not parsed and not problems:
        problems.append((1, "the file holds no tasks"))
    ordered = _ordered(parsed, problems)
    problems += _document_conflicts(parsed)
    if problems:
        raise TaskFileError(source, sorted(problems))
    return ordered


def _task_of_line(line: str, number: int) -> EvalTask:
    raw = json_object(line, _LineError)
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise _LineError(f"unknown field(s) {unknown}; allowed: {sorted(_FIELDS)}")
    conversation_id = _optional_text(raw, "conversation_id")
    turn = raw.get("turn")
    if turn is not None and (isinstance(turn, bool) or not isinstance(turn, int) or turn < 0):
        raise _LineError(f"'turn' must be an integer >= 0, got {turn!r}")
    history = _history(raw.get("history", []))
    if conversation_id is not None and history:
        raise _LineError(
            "'history' is for a task outside a conversation; the turns of a "
            "'conversation_id' get their history from the conversation's earlier lines"
        )
    answerable = raw.get("answerable")
    if answerable is not None and not isinstance(answerable, bool):
        raise _LineError(f"'answerable' must be true or false, got {answerable!r}")
    question = _required_text(raw, "question")
    return EvalTask(
        task_id=f"{conversation_id}#{turn}" if conversation_id is not None else f"line-{number}",
        question=question,
        documents=_documents(raw.get("documents")),
        references=_references(raw.get("reference")),
        answerable=answerable,
        conversation_id=conversation_id,
        turn=turn,
        history=history,
    )


def _required_text(raw: Mapping[str, Any], name: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str) or not value.strip():
        raise _LineError(f"'{name}' must be a non-empty string, got {value!r}")
    _check_encodable(f"'{name}'", value)
    return value


def _check_encodable(what: str, text: str) -> None:
    """Text that cannot be sent or written as UTF-8 (a lone surrogate) is the line's error."""
    try:
        check_encodable(what, text)
    except InvalidInputError as exc:
        raise _LineError(str(exc)) from None


def _optional_text(raw: Mapping[str, Any], name: str) -> str | None:
    return None if raw.get(name) is None else _required_text(raw, name)


def _documents(value: Any) -> tuple[ContextBlock, ...]:
    if not isinstance(value, list):
        raise _LineError(f"'documents' must be a list (possibly empty), got {value!r}")
    documents: dict[str, ContextBlock] = {}
    for position, item in enumerate(value):
        block = _document(item, position)
        seen = documents.get(block.id)
        if seen is not None and seen.text != block.text:
            raise _LineError(f"documents[{position}]: id {block.id!r} given twice, different text")
        documents.setdefault(block.id, block)
    return tuple(documents.values())


def _document(item: Any, position: int) -> ContextBlock:
    where = f"documents[{position}]"
    if isinstance(item, str):
        if not item.strip():
            raise _LineError(f"{where} is an empty string")
        return _block(item, None, where)
    if not isinstance(item, dict):
        raise _LineError(f"{where} must be a string or {{'id', 'text'}}, got {item!r}")
    unknown = sorted(set(item) - {"id", "text"})
    if unknown:
        raise _LineError(f"{where}: unknown field(s) {unknown}; allowed: ['id', 'text']")
    text, block_id = item.get("text"), item.get("id")
    if not isinstance(text, str) or not text.strip():
        raise _LineError(f"{where}.text must be a non-empty string, got {text!r}")
    if block_id is not None and (not isinstance(block_id, str) or not block_id.strip()):
        raise _LineError(f"{where}.id must be a non-empty string, got {block_id!r}")
    return _block(text, block_id, where)


def _block(text: str, block_id: str | None, where: str) -> ContextBlock:
    try:
        return ContextBlock(text) if block_id is None else ContextBlock(text, id=block_id)
    except InvalidInputError as exc:
        raise _LineError(f"{where}: {exc}") from None


def _history(value: Any) -> tuple[HistoryMessage, ...]:
    if not isinstance(value, list):
        raise _LineError(f"'history' must be a list of {{'role', 'content'}}, got {value!r}")
    messages = []
    for position, item in enumerate(value):
        role = item.get("role") if isinstance(item, dict) else None
        content = item.get("content") if isinstance(item, dict) else None
        if not isinstance(item, dict) or set(item) != {"role", "content"}:
            raise _LineError(f"history[{position}] must be {{'role', 'content'}}, got {item!r}")
        if role not in _ROLES:
            raise _LineError(f"history[{position}].role must be one of {_ROLES}, got {role!r}")
        if not isinstance(content, str):
            raise _LineError(f"history[{position}].content must be a string, got {content!r}")
        _check_encodable(f"history[{position}].content", content)
        messages.append(HistoryMessage(role, content))
    return tuple(messages)


def _references(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        _check_encodable("'reference'", value)
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _LineError(f"'reference' must be a string or a list of strings, got {value!r}")
    for position, reference in enumerate(value):
        _check_encodable(f"reference[{position}]", reference)
    return tuple(v for v in value if v.strip())


def _ordered(
    parsed: Sequence[tuple[int, EvalTask]], problems: list[tuple[int, str]]
) -> tuple[EvalTask, ...]:
    """Conversations where their first line is, their turns in turn order (file
    order where ``turn`` is absent); problems of turn numbering and missing answers
    are added to ``problems``."""
    groups: dict[str, list[tuple[int, EvalTask]]] = {}
    order: list[tuple[int, EvalTask] | str] = []
    for number, task in parsed:
        if task.conversation_id is None:
            order.append((number, task))
            continue
        if task.conversation_id not in groups:
            groups[task.conversation_id] = []
            order.append(task.conversation_id)
        groups[task.conversation_id].append((number, task))
    tasks: list[EvalTask] = []
    for entry in order:
        if isinstance(entry, str):
            tasks += _conversation_turns(entry, groups[entry], problems)
        else:
            tasks.append(entry[1])
    return tuple(tasks)


def _conversation_turns(
    conversation_id: str, lines: list[tuple[int, EvalTask]], problems: list[tuple[int, str]]
) -> list[EvalTask]:
    numbered = [task.turn is not None for _, task in lines]
    if any(numbered) and not all(numbered):
        for number, task in lines:
            if task.turn is None:
                problems.append(
                    (number, f"conversation {conversation_id!r} numbers its turns: add 'turn'")
                )
        return []
    if all(numbered):
        lines = sorted(lines, key=lambda line: int(line[1].turn or 0))
    seen: dict[int, int] = {}
    for number, task in lines:
        if task.turn is not None and task.turn in seen:
            message = f"turn {task.turn} of conversation {conversation_id!r} is also on line "
            problems.append((number, message + str(seen[task.turn])))
        elif task.turn is not None:
            seen[task.turn] = number
    for number, task in lines[:-1]:
        if not task.references:
            problems.append(
                (
                    number,
                    f"conversation {conversation_id!r}: a turn followed by later turns needs "
                    "a 'reference' (it is the assistant's answer in their history)",
                )
            )
    return [
        task if task.turn is not None else _with_turn(task, position)
        for position, (_, task) in enumerate(lines, start=1)
    ]


def _with_turn(task: EvalTask, turn: int) -> EvalTask:
    return replace(task, turn=turn, task_id=f"{task.conversation_id}#{turn}")


def _document_conflicts(parsed: Sequence[tuple[int, EvalTask]]) -> list[tuple[int, str]]:
    """A document id names one text in the whole file (the pilots share a registry)."""
    texts: dict[str, tuple[int, str]] = {}
    problems = []
    for number, task in parsed:
        for block in task.documents:
            first = texts.setdefault(block.id, (number, block.text))
            if first[1] != block.text:
                problems.append(
                    (number, f"document id {block.id!r} has another text on line {first[0]}")
                )
    return problems


# -- selection ---------------------------------------------------------------------


def load_tasks(
    spec: str,
    *,
    contexts: str | None = None,
    top_k: int | None = None,
    limit: int | None = None,
) -> tuple[EvalTask, ...]:
    """The first ``limit`` tasks (``None``: all) of ``"mtrag"`` (the bundled MTRAG
    tasks; ``contexts`` and ``top_k`` as :func:`mtrag_tasks` takes them) or of a JSONL
    task file (which brings its own documents: ``contexts`` and ``top_k`` must be
    ``None``; the whole file is validated)."""
    if spec == MTRAG:
        top_k = 3 if top_k is None else top_k
        return mtrag_tasks(contexts=contexts or "bm25", top_k=top_k, limit=limit)
    if contexts is not None or top_k is not None:
        raise ConfigError(
            "--contexts and --top-k choose MTRAG's documents; a task file has its own"
        )
    return limit_tasks(load_jsonl_tasks(spec), limit)


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit must be an integer >= 1, got {limit!r}")


def limit_tasks(tasks: Sequence[EvalTask], limit: int | None) -> tuple[EvalTask, ...]:
    """The first ``limit`` tasks in replay order (``None``: all). Cutting inside a
    conversation keeps its first turns, so the kept turns still have their history."""
    _check_limit(limit)
    return tuple(tasks[:limit])
