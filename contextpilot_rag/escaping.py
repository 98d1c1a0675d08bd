"""Untrusted text cannot forge the prompt's structure.

Documents, queries and answers come from outside (a web crawl, an end user, an engine)
and are rendered inside a prompt whose structure is ours: block label lines
(``[label]``), the context header, the order and location notes, the question line,
and the chat template the engine wraps around the messages. Two escapes, applied on
render, keep outside text from imitating any of it:

- **Chat-template control tokens** (``<|im_start|>``, ``<|eot_id|>``,
  ``<start_of_turn>``, ``</s>``, ``[INST]``, ``<｜User｜>``, ``<tool_call>``, ...): a
  zero-width space (U+200B) is inserted after the first character of each, so no
  tokenizer reads it as its special token and no template sees a message boundary.
  The text still reads the same to a person.
- **Lines that look like our structure**: a line that is a lone bracketed word (a
  label line), or that starts (ignoring case, surrounding and repeated spaces) with the
  literal lead-in of a note, the question or the context header, gets a backslash
  before its first character. Our own structure never starts a line with a
  backslash, so an escaped line is always content.

The escapes depend only on the text (and the pilot's templates), so a block still
renders to the same bytes wherever it appears. See ``docs/security.md`` for what this
does and does not protect against.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

__all__ = ["CONTROL_TOKEN", "StructureGuard", "neutralize_control_tokens"]

_ZERO_WIDTH_SPACE = "\u200b"

CONTROL_TOKEN = re.compile(
    "|".join(
        (
            r"<\|[^|<>\n]{1,64}\|>",  # ChatML, Llama 3, Phi, Granite, Command-R, GPT-OSS
            r"<｜[^｜<>\n]{1,64}｜>",  # DeepSeek (full-width bars)
            r"</?(?:s|bos|eos|unk|pad|start_of_turn|end_of_turn|start_of_image|end_of_image)>",
            r"</?(?:tool_call|tool_response|tools|think)>",  # Qwen / Hermes tool tags
            r"<</?SYS>>",  # Llama 2
            r"\[/?[A-Z][A-Z_]{2,31}\]",  # Llama 2 / Mistral: [INST], [/INST], [TOOL_CALLS]
        )
    )
)
"""Strings that a chat template or tokenizer treats as control tokens."""

_LABEL_LINE = re.compile(r"\[[^\]\n]*\]")
_INVISIBLE = re.compile(  # what a reader does not see:
    # Unicode's format characters (category Cf): zero-width, bidi, tags
    "[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f"
    "\u202a-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f"
    # the other default-ignorable code points: variation selectors, fillers, U+034F
    "\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0"
    # a symbol drawn blank: the empty braille pattern
    "\u2800"
    "\ufff0-\ufff8\U000e0000-\U000e0fff"
    # control characters that break no line (those that do end it already)
    "\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f]"
)


def neutralize_control_tokens(text: str) -> str:
    """``text`` with every :data:`CONTROL_TOKEN` broken by a zero-width space."""
    if "<" not in text and "[" not in text:  # every control token has one
        return text
    while True:  # one pass suffices in practice; loop until none is left, to be sure
        escaped = CONTROL_TOKEN.sub(_break, text)
        if escaped == text:
            return text
        text = escaped


def _break(match: re.Match[str]) -> str:
    token = match.group(0)
    return token[0] + _ZERO_WIDTH_SPACE + token[1:]


def _normalized(line: str) -> str:
    """What a reader sees of ``line``: compatibility forms folded (full-width
    brackets), invisible characters dropped, spaces collapsed, case folded."""
    if not line.isascii():  # ASCII has no compatibility forms
        line = _INVISIBLE.sub("", unicodedata.normalize("NFKC", line))
    elif not line.isprintable():
        line = _INVISIBLE.sub("", line)
    return " ".join(line.split()).casefold()


class StructureGuard:
    """Escapes untrusted text for one prompt layout.

    ``lead_ins`` are the literal beginnings of the structural lines of the layout
    (``"Most relevant first:"``, ``"Question:"``, ...); an empty one is ignored (a
    template that starts with its placeholder has no lead-in to protect).
    ``note_lead_ins``: those of the order and location notes (:meth:`is_note`), an
    empty one for a note template that starts with its placeholder."""

    __slots__ = ("_bare_notes", "_first_chars", "_lead_ins", "_note_lead_ins")

    def __init__(self, lead_ins: Iterable[str], *, note_lead_ins: Iterable[str] = ()) -> None:
        normalized = {_normalized(lead_in) for lead_in in lead_ins}
        notes = {_normalized(lead_in) for lead_in in note_lead_ins}
        self._lead_ins = tuple(sorted(lead_in for lead_in in normalized | notes if lead_in))
        self._note_lead_ins = tuple(sorted(lead_in for lead_in in notes if lead_in))
        self._bare_notes = "" in notes
        # what a suspect line can start with: a lead-in's first character or "["
        self._first_chars = frozenset({"[", *(lead_in[0] for lead_in in self._lead_ins)})

    @property
    def lead_ins(self) -> tuple[str, ...]:
        return self._lead_ins

    def with_lead_ins(self, *lead_ins: str) -> StructureGuard:
        """This guard with more structural lines to protect (an integration's own,
        such as the line a framework shows a label on); the notes stay as they are."""
        notes = (*self._note_lead_ins, *(("",) if self._bare_notes else ()))
        return StructureGuard((*self._lead_ins, *lead_ins), note_lead_ins=notes)

    def is_note(self, text: str) -> bool:
        """Whether ``text`` could be one of this layout's notes: one line, no control
        token, starting as a note does (a note template without a lead-in: not
        imitating any other structural line). An outside record (document metadata)
        that reports a note is shown only then, so it cannot add a question line, a
        label line or a turn marker to the prompt."""
        if not text or len(text.splitlines()) != 1 or CONTROL_TOKEN.search(text):
            return False
        visible = _normalized(text)
        if not visible or _LABEL_LINE.fullmatch(visible):
            return False
        if self._note_lead_ins and visible.startswith(self._note_lead_ins):
            return True
        return self._bare_notes and not self._imitates(text)

    def escape(self, text: str) -> str:
        """``text`` safe to render inside a prompt: control tokens broken, lines that
        imitate a label, a note, the question or the header escaped."""
        lines = neutralize_control_tokens(text).splitlines(keepends=True)
        return "".join(self._escape_line(line) for line in lines)

    def _escape_line(self, line: str) -> str:
        if not self._imitates(line):
            return line
        start = len(line) - len(line.lstrip())
        return line[:start] + "\\" + line[start:]

    def _imitates(self, line: str) -> bool:
        stripped = line.strip()
        first = stripped[:1]
        if stripped.isascii() and first.isprintable() and first.lower() not in self._first_chars:
            return False  # the common case, decided without normalizing
        visible = _normalized(line)
        if not visible:
            return False
        if _LABEL_LINE.fullmatch(visible):
            return True
        return visible.startswith(self._lead_ins) if self._lead_ins else False


def template_lead_in(template: str) -> str:
    """The literal text of a template before its first placeholder, first line only."""
    head = template.split("{", 1)[0]
    return head.strip().split("\n", 1)[0]


def template_line_lead_ins(template: str) -> tuple[str, ...]:
    """The literal start of every line of a template (up to a placeholder): a
    multi-line template (``"Answer from the documents.\nQuestion: {query}"``) makes
    each of its lines a structural line to protect, not only the first."""
    heads = (line.split("{", 1)[0].strip() for line in template.splitlines())
    return tuple(head for head in heads if head)
