"""Answer-quality evaluation: does reordering, annotating and de-duplicating the
context change what a model answers?

The same tasks (MTRAG's conversations, or the user's JSONL) are sent several ways
(:mod:`.arms`: ``unmodified``, ``reordered``, ``reordered+notes``,
``reordered+dedup+notes``, optionally ``documents-in-history``) to an
OpenAI-compatible endpoint (:mod:`.client`); each answer is scored
(:mod:`.metrics`: token F1, ROUGE-L, answerability, citation validity) and each arm
is compared with ``unmodified`` on the same tasks with a paired cluster bootstrap
(:mod:`.stats`, :mod:`.report`). Every prompt is checked for evidence retention
(:mod:`.retention`). ``contextpilot-rag eval`` is the command (``docs/eval.md``).
"""

from .arms import ARM_NAMES, ARMS, BASELINE, DEFAULT_ARMS, ArmPrompt, ArmSpec, build_prompts
from .client import Completion, Endpoint, complete_all
from .metrics import AnswerScores, declines, rouge_l, score_answer, token_f1
from .report import EvalSummary, summarize
from .retention import ExpectedBlock, lost_blocks
from .run import EvalRun, EvalSettings, run_evaluation
from .stats import Estimate, bootstrap_mean, paired_difference, significant_drop
from .tasks import EvalTask, TaskFileError, load_jsonl_tasks, load_tasks, mtrag_tasks

__all__ = [
    "ARMS",
    "ARM_NAMES",
    "BASELINE",
    "DEFAULT_ARMS",
    "AnswerScores",
    "ArmPrompt",
    "ArmSpec",
    "Completion",
    "Endpoint",
    "Estimate",
    "EvalRun",
    "EvalSettings",
    "EvalSummary",
    "EvalTask",
    "ExpectedBlock",
    "TaskFileError",
    "bootstrap_mean",
    "build_prompts",
    "complete_all",
    "declines",
    "load_jsonl_tasks",
    "load_tasks",
    "lost_blocks",
    "mtrag_tasks",
    "paired_difference",
    "rouge_l",
    "run_evaluation",
    "score_answer",
    "significant_drop",
    "summarize",
    "token_f1",
]
