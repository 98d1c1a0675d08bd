"""contextpilot-rag for LlamaIndex: a node postprocessor that reorders retrieved nodes
so prompts share cached prefixes, and annotates them; an instrumentation handler that
reports what the engine served from its cache back to the pilot.

>>> from contextpilot_rag import ContextPilot
>>> from llama_index.postprocessor.contextpilot import (
...     ContextPilotEventHandler,
...     ContextPilotNodePostprocessor,
... )
>>> pilot = ContextPilot()  # one pilot per process
>>> postprocessor = ContextPilotNodePostprocessor(pilot=pilot)
>>> handler = ContextPilotEventHandler(pilot).attach()  # the engine's cache truth
>>> # index.as_query_engine(node_postprocessors=[postprocessor])
>>> handler.detach()
"""

from llama_index.postprocessor.contextpilot.base import (
    ANNOTATION_KEYS,
    DEDUPLICATED_KEY,
    HISTORY_LOST_KEY,
    LABEL_KEY,
    MATCHED_KEY,
    NOTES_KEY,
    RANK_KEY,
    REQUEST_ID_KEY,
    ContextPilotNodePostprocessor,
    ContextPilotPromptEvent,
)
from llama_index.postprocessor.contextpilot.feedback import ContextPilotEventHandler

__all__ = [
    "ANNOTATION_KEYS",
    "DEDUPLICATED_KEY",
    "HISTORY_LOST_KEY",
    "LABEL_KEY",
    "MATCHED_KEY",
    "NOTES_KEY",
    "RANK_KEY",
    "REQUEST_ID_KEY",
    "ContextPilotEventHandler",
    "ContextPilotNodePostprocessor",
    "ContextPilotPromptEvent",
]
