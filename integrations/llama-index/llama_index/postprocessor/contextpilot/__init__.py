"""contextpilot-rag for LlamaIndex: a node postprocessor that reorders retrieved nodes
so prompts share cached prefixes, and annotates them.

>>> from contextpilot_rag import ContextPilot
>>> from llama_index.postprocessor.contextpilot import ContextPilotNodePostprocessor
>>> postprocessor = ContextPilotNodePostprocessor(pilot=ContextPilot())  # one pilot per process
>>> # index.as_query_engine(node_postprocessors=[postprocessor])
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
)

__all__ = [
    "ANNOTATION_KEYS",
    "DEDUPLICATED_KEY",
    "HISTORY_LOST_KEY",
    "LABEL_KEY",
    "MATCHED_KEY",
    "NOTES_KEY",
    "RANK_KEY",
    "REQUEST_ID_KEY",
    "ContextPilotNodePostprocessor",
]
