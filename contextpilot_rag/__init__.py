"""contextpilot_rag: reorder, de-duplicate and annotate RAG context blocks so that
inference engines reuse their prefix cache.

>>> from contextpilot_rag import ContextPilot, ContextBlock
>>> pilot = ContextPilot()
>>> prompt = pilot.optimize([ContextBlock("Paris is in France.")], "Where is Paris?")
>>> prompt.messages[-1]["role"]
'user'

The facade (``ContextPilot``, ``PilotConfig``) is imported on first use, so importing
a lower layer (``contextpilot_rag.routing``, ``contextpilot_rag.sim``) does not import
the layers above it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .annotations import NoteTemplates
from .blocks import BlockId, ContextBlock, content_id, render_block
from .conversations import (
    Conversation,
    ConversationStore,
    InMemoryConversationStore,
    Turn,
)
from .errors import (
    BlockConflictError,
    ConfigError,
    ContextPilotError,
    ConversationExpiredError,
    ConversationStateError,
    DuplicateRequestError,
    EmptyContextError,
    InvalidBlockError,
    InvalidInputError,
    OversizeBlockError,
    UnknownConversationError,
)
from .index import ContextIndex, IndexConfig, IndexStats, MatchResult, RequestId
from .prompt import BlockBoundary, Prompt, PromptStats
from .tokenizers import (
    CharEstimateTokenizer,
    HFTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    default_tokenizer,
)

if TYPE_CHECKING:
    from .pilot import ContextPilot, PilotConfig

__version__ = "0.1.0"

__all__ = [
    "BlockBoundary",
    "BlockConflictError",
    "BlockId",
    "CharEstimateTokenizer",
    "ConfigError",
    "ContextBlock",
    "ContextIndex",
    "ContextPilot",
    "ContextPilotError",
    "Conversation",
    "ConversationExpiredError",
    "ConversationStateError",
    "ConversationStore",
    "DuplicateRequestError",
    "EmptyContextError",
    "HFTokenizer",
    "InMemoryConversationStore",
    "IndexConfig",
    "IndexStats",
    "InvalidBlockError",
    "InvalidInputError",
    "MatchResult",
    "NoteTemplates",
    "OversizeBlockError",
    "PilotConfig",
    "Prompt",
    "PromptStats",
    "RequestId",
    "TiktokenTokenizer",
    "Tokenizer",
    "Turn",
    "UnknownConversationError",
    "__version__",
    "content_id",
    "default_tokenizer",
    "render_block",
]

_LAZY = frozenset({"ContextPilot", "PilotConfig"})  # the facade, from .pilot


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import pilot

    value = getattr(pilot, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)
