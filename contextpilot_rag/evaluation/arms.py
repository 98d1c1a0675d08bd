"""The arms of the evaluation: the same tasks turned into chat messages several ways.

Every arm goes through a :class:`~contextpilot_rag.ContextPilot` (one per arm, shared
by all its tasks, as an application keeps one) with the same system prompt
(:data:`~contextpilot_rag.pilot.DEFAULT_SYSTEM_PROMPT`: it asks for labels) and the
same rendering of blocks (label line, text); only the switches and the history differ:

=========================  =======  =====  =====  ==========================================
arm                        reorder  notes  dedup  history of a later turn
=========================  =======  =====  =====  ==========================================
``unmodified``             no       no     no     questions and answers (as in the task)
``reordered``              yes      no     no     questions and answers
``reordered+notes``        yes      yes    no     questions and answers
``reordered+dedup+notes``  yes      yes    yes    earlier turns with their documents
``documents-in-history``   no       no     no     earlier turns with their documents
=========================  =======  =====  =====  ==========================================

The first three are the usual RAG chain: this turn's documents in this turn's user
message, the conversation so far as questions and answers (the task's earlier
questions, and their *reference* answers as the assistant's, so that no arm's history
depends on the model's answers); the pilot builds the message without a conversation
(:meth:`~contextpilot_rag.ContextPilot.optimize` across all the arm's requests, so a
turn whose documents an earlier request sent starts with them). The last two are the
multi-turn pilot (``conversation_id``): every turn's documents stay in its user
message in the history (as agents keep tool results), with the reference answers; the
dedup arm replaces a block an earlier turn of the prompt shows by a location note.
``documents-in-history`` (not run by default) is that pattern with every block sent
again: the dedup arm's own baseline, isolating de-duplication from the change of
pattern.

A turn without documents (MTRAG's unanswerable and conversational turns) cannot go
through the pilot; its message is the question alone (the pilot's question line) and
it takes its place in the history of later turns all the same. ``max_history_turns``
limits the history to the last that many turns *with documents* (and the turns
without documents between them) in every arm: the window the multi-turn pilot
renders.

Each :class:`ArmPrompt` carries the result of the evidence-retention check
(:mod:`.retention`) on its messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..blocks import render_block
from ..errors import ConfigError
from ..escaping import StructureGuard
from ..pilot import ContextPilot, PilotConfig, structure_guard_of
from ..prompt import Prompt
from ..tokenizers import Tokenizer
from .retention import ExpectedBlock, lost_blocks, shown_labels
from .tasks import EvalTask

__all__ = [
    "ARMS",
    "ARM_NAMES",
    "BASELINE",
    "DEFAULT_ARMS",
    "ArmPrompt",
    "ArmSpec",
    "arm_spec",
    "build_prompts",
]

Message = Mapping[str, str]


@dataclass(frozen=True)
class ArmSpec:
    """One arm: its name, the pilot switches it runs with and whether a later turn's
    history carries the earlier turns' documents (``documents_in_history``: the
    multi-turn pilot) or only their questions and answers. ``claims_retention``: the
    arm promises that every block is in the prompt or pointed at by a note."""

    name: str
    reorder: bool
    annotate: bool
    dedup: bool
    documents_in_history: bool
    description: str
    claims_retention: bool = True

    def config(self, max_history_turns: int | None = None) -> PilotConfig:
        return replace(
            PilotConfig(),
            reorder=self.reorder,
            annotate=self.annotate,
            dedup=self.dedup,
            max_history_turns=max_history_turns,
        )


BASELINE = "unmodified"
ARMS = (
    ArmSpec(BASELINE, False, False, False, False, "documents in retrieval order"),
    ArmSpec("reordered", True, False, False, False, "the pilot's order, no notes"),
    ArmSpec("reordered+notes", True, True, False, False, "the pilot's order, order note"),
    ArmSpec(
        "reordered+dedup+notes",
        True,
        True,
        True,
        True,
        "the multi-turn pilot: blocks of earlier turns as notes",
    ),
    ArmSpec(
        "documents-in-history",
        False,
        False,
        False,
        True,
        "earlier turns keep their documents, each block sent again",
    ),
)
ARM_NAMES = tuple(arm.name for arm in ARMS)
DEFAULT_ARMS = ARM_NAMES[:4]
"""The arms run unless others are asked for."""


def arm_spec(name: str) -> ArmSpec:
    for arm in ARMS:
        if arm.name == name:
            return arm
    raise KeyError(name)


@dataclass(frozen=True)
class ArmPrompt:
    """What one arm sends for one task. ``labels``: the labels the prompt shows
    (``None`` when it does not ask for labels); ``lost``: ids of blocks the prompt
    does not retain (empty: all retained); ``deduplicated``: blocks sent as notes."""

    task_id: str
    messages: tuple[Message, ...]
    labels: frozenset[str] | None
    lost: tuple[str, ...] = ()
    deduplicated: int = 0


@dataclass(frozen=True)
class _Turn:
    """One earlier turn of a conversation: as the task has it (``question``,
    ``reference``) and as the multi-turn pilot rendered it (``user``, ``answer``)."""

    question: str
    reference: str
    user: str
    answer: str
    documented: bool  # went through the pilot (it has documents)


@dataclass
class _Replay:
    """The turns of one conversation so far, for one arm."""

    turns: list[_Turn] = field(default_factory=list)

    def window(self, documented_shown: int | None) -> list[_Turn]:
        """The turns from the ``documented_shown``-th last documented turn on
        (``None``, or fewer documented turns: all)."""
        documented = [i for i, turn in enumerate(self.turns) if turn.documented]
        if documented_shown is None or documented_shown >= len(documented):
            return list(self.turns)
        if documented_shown == 0:
            return self.turns[documented[-1] + 1 :]
        return self.turns[documented[-documented_shown] :]


class _ArmBuilder:
    def __init__(
        self, arm: ArmSpec, max_history_turns: int | None, tokenizer: Tokenizer | None
    ) -> None:
        self.arm = arm
        self.max_history_turns = max_history_turns
        self.pilot = ContextPilot(arm.config(max_history_turns), tokenizer=tokenizer)
        self.guard: StructureGuard = structure_guard_of(self.pilot)
        config = self.pilot.config
        self.system: Message = {"role": "system", "content": config.system_prompt or ""}
        self.lead_in = config.notes.location.split("{groups}")[0]
        self.replays: dict[str, _Replay] = {}

    def build(self, task: EvalTask) -> ArmPrompt:
        replay = None
        if task.conversation_id is not None:
            replay = self.replays.setdefault(task.conversation_id, _Replay())
        conversation = task.conversation_id if self.arm.documents_in_history else None
        prompt = None
        if task.documents:
            prompt = self.pilot.optimize(
                task.documents, task.question, conversation_id=conversation
            )
            final = prompt.messages[-1]
        else:
            query = self.guard.escape(task.question)
            final = {
                "role": "user",
                "content": self.pilot.config.question_template.format(query=query),
            }
        history = self._history(task, replay, prompt)
        if replay is not None:
            self._remember(task, replay, final["content"], prompt)
        messages = (self.system, *history, final)
        if prompt is None:
            return ArmPrompt(task.task_id, messages, shown_labels(messages))
        if prompt.messages[0] != self.system:
            raise RuntimeError(f"arm {self.arm.name!r}: the pilot's system message differs")
        return ArmPrompt(
            task.task_id,
            messages,
            shown_labels(messages),
            lost_blocks(messages, self._expected(task, prompt), self.lead_in),
            len(prompt.deduplicated),
        )

    def _history(
        self, task: EvalTask, replay: _Replay | None, prompt: Prompt | None
    ) -> list[Message]:
        if replay is None:
            return [{"role": m.role, "content": m.content} for m in task.history]
        if not self.arm.documents_in_history:
            turns = replay.window(self.max_history_turns)
            return _flat((turn.question, turn.reference) for turn in turns)
        if prompt is None:
            turns = replay.window(self.max_history_turns)
        else:
            turns = self._pilot_window(prompt, replay)
        return _flat((turn.user, turn.answer) for turn in turns)

    def _pilot_window(self, prompt: Prompt, replay: _Replay) -> list[_Turn]:
        """The earlier turns this prompt carries: the documented turns the pilot
        rendered, with the question-only turns between them put back in place."""
        rendered = prompt.messages[1:-1]
        window = replay.window(len(rendered) // 2)
        pairs = [
            (rendered[i]["content"], rendered[i + 1]["content"]) for i in range(0, len(rendered), 2)
        ]
        if pairs != [(turn.user, turn.answer) for turn in window if turn.documented]:
            raise RuntimeError(
                f"arm {self.arm.name!r}: the pilot's history of {prompt.conversation_id!r} "
                "differs from the replayed turns"
            )
        return window

    def _remember(self, task: EvalTask, replay: _Replay, user: str, prompt: Prompt | None) -> None:
        reference = task.references[0] if task.references else ""
        if prompt is not None and prompt.conversation_id is not None and reference:
            self.pilot.record_answer(prompt, reference)
        turn = _Turn(
            task.question, reference, user, self.guard.escape(reference), prompt is not None
        )
        replay.turns.append(turn)

    def _expected(self, task: EvalTask, prompt: Prompt) -> list[ExpectedBlock]:
        expected = []
        for block in task.documents:
            label = prompt.label_of(block.id)
            rendered = render_block(block, self.guard, label=label)
            expected.append(ExpectedBlock(block.id, label, rendered))
        return expected


def _flat(turns: Iterable[tuple[str, str]]) -> list[Message]:
    messages: list[Message] = []
    for user, assistant in turns:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return messages


def build_prompts(
    arm: ArmSpec,
    tasks: Sequence[EvalTask],
    *,
    max_history_turns: int | None = None,
    tokenizer: Tokenizer | None = None,
) -> tuple[ArmPrompt, ...]:
    """What ``arm`` sends for each task, in task order (conversations replayed turn by
    turn). A pure function of its arguments: one fresh pilot per call. A turn followed
    by later turns of its conversation needs a reference (its answer in their
    history): :class:`~contextpilot_rag.errors.ConfigError` otherwise, before any
    prompt is built."""
    _check_histories(tasks)
    builder = _ArmBuilder(arm, max_history_turns, tokenizer)
    return tuple(builder.build(task) for task in tasks)


def _check_histories(tasks: Sequence[EvalTask]) -> None:
    """Every turn followed by a later turn of its conversation has a reference answer
    (the task-file loader checks this too; tasks built in Python are checked here)."""
    last = {task.conversation_id: index for index, task in enumerate(tasks)}
    for index, task in enumerate(tasks):
        followed = task.conversation_id is not None and index < last[task.conversation_id]
        if followed and not task.references:
            raise ConfigError(
                f"task {task.task_id!r}: a turn followed by later turns of conversation "
                f"{task.conversation_id!r} needs a reference (the assistant's answer "
                "in their history)"
            )
