"""Per-answer scores: token F1, ROUGE-L, answerability and citation validity.

Each score is a float in [0, 1], or ``None`` where it does not apply (no reference, no
answerability label, no label cited); :mod:`.stats` averages only the tasks where it
applies, and compares two arms only on tasks where both have it.

* **token F1** — SQuAD's: both texts lower-cased, punctuation and the articles *a, an,
  the* removed, split on white space; F1 of the bag-of-tokens overlap, the best over
  the references.
* **ROUGE-L** — the F-measure of the longest common subsequence of tokens
  (``rouge-score``, Porter stemming on), the best over the references. ``rouge-score``
  is the ``eval`` extra, imported on first use.
* **answerability** — 1 when the answer does what the task calls for: *declines* an
  unanswerable task, *answers* (does not decline) an answerable one. An answer declines
  when one of :data:`DECLINE_PATTERNS` occurs in its first :data:`DECLINE_WINDOW_CHARS`
  characters (where models say so: "The documents do not provide ...", "I'm sorry,
  I don't have information about ..."). A lexical detector: it misses refusals worded
  otherwise and reads an answer that opens with "unfortunately, the feature is not
  available" as one; both arms get the same detector, so the comparison stays fair.
* **citations** — when the prompt asks for labels: 1 when every label the answer cites
  (``[label]``) is one the prompt shows, 0 when any is not (an invented source),
  ``None`` when it cites none.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import ConfigError

__all__ = [
    "DECLINE_PATTERNS",
    "DECLINE_WINDOW_CHARS",
    "AnswerScores",
    "answerability",
    "citations_valid",
    "cited_labels",
    "declines",
    "normalize_answer",
    "rouge_l",
    "score_answer",
    "token_f1",
]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_CITATION = re.compile(r"\[([^\[\]\s]{1,64})\]")

DECLINE_WINDOW_CHARS = 200
"""Only the opening of an answer is searched for a refusal: a model that declines
says so first, and later sentences of a real answer may say that *something* is not
mentioned."""

DECLINE_PATTERNS = (
    r"\b(?:i|we) (?:do not|don't|cannot|can't|could not|couldn't|am unable to) "
    r"(?:know|find|answer|determine|tell|say|provide)\b",
    r"\b(?:i|we) (?:do not|don't) have (?:any |enough |specific |the |that |this )?"
    r"(?:specific )?(?:information|details|data|knowledge|answer)\b",
    r"\b(?:does|do|did)(?: not|n't) (?:contain|provide|include|mention|specify|say|state|"
    r"cover|address|answer|give|discuss)\b",
    r"\bno (?:information|mention|details|data|answer)\b",
    r"\b(?:is|are|was|were)(?: not|n't) (?:mentioned|provided|specified|stated|included|"
    r"covered|addressed|given|discussed)\b",
    r"\b(?:unable|not able) to (?:find|answer|determine|provide)\b",
    r"\b(?:i'm|i am) (?:sorry|afraid)\b",
    r"^(?:sorry|unfortunately)\b",
)
"""Regular expressions (on the lower-cased answer, curly apostrophes made straight)
that mark a refusal."""

_DECLINE = re.compile("|".join(f"(?:{pattern})" for pattern in DECLINE_PATTERNS))


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _f1(prediction: str, reference: str) -> float:
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, references: Sequence[str]) -> float | None:
    """SQuAD token F1 against the best reference (``None`` without references)."""
    if not references:
        return None
    return max(_f1(prediction, reference) for reference in references)


@lru_cache(maxsize=1)
def _rouge_scorer() -> Any:
    try:
        from rouge_score import rouge_scorer
    except ImportError as exc:
        raise ConfigError(
            "ROUGE-L needs the rouge-score package: pip install 'contextpilot-rag[eval]'"
        ) from exc
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(prediction: str, references: Sequence[str]) -> float | None:
    """ROUGE-L F-measure against the best reference (``None`` without references).
    Raises :class:`~contextpilot_rag.errors.ConfigError` when rouge-score is missing."""
    if not references:
        return None
    scorer = _rouge_scorer()
    return max(float(scorer.score(ref, prediction)["rougeL"].fmeasure) for ref in references)


def declines(answer: str) -> bool:
    """Whether ``answer`` is a refusal ("the documents do not say", "I don't know")."""
    opening = answer.strip().lower().replace("\u2019", "'")[:DECLINE_WINDOW_CHARS]
    return _DECLINE.search(opening) is not None


def answerability(answer: str, answerable: bool | None) -> float | None:
    """1 when the answer declines an unanswerable task or answers an answerable one."""
    if answerable is None:
        return None
    return float(declines(answer) != answerable)


def cited_labels(answer: str) -> tuple[str, ...]:
    """The labels the answer cites as ``[label]``, in order, each once."""
    return tuple(dict.fromkeys(_CITATION.findall(answer)))


def citations_valid(answer: str, prompt_labels: Collection[str]) -> float | None:
    """1 when every cited label is one of ``prompt_labels``, 0 when one is not,
    ``None`` when the answer cites none."""
    cited = cited_labels(answer)
    if not cited:
        return None
    return float(all(label in prompt_labels for label in cited))


@dataclass(frozen=True)
class AnswerScores:
    """The scores of one answer (``None``: does not apply)."""

    f1: float | None
    rouge_l: float | None
    answerability: float | None
    citations: float | None

    def get(self, metric: str) -> float | None:
        value: float | None = getattr(self, metric)
        return value


def score_answer(
    answer: str,
    references: Sequence[str],
    answerable: bool | None,
    prompt_labels: Collection[str] | None,
) -> AnswerScores:
    """All scores of one answer; ``prompt_labels`` is ``None`` when the prompt does not
    ask for labels (no citation score then)."""
    return AnswerScores(
        f1=token_f1(answer, references),
        rouge_l=rouge_l(answer, references),
        answerability=answerability(answer, answerable),
        citations=None if prompt_labels is None else citations_valid(answer, prompt_labels),
    )
