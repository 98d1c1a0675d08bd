"""contextpilot_mem0: mem0 memories in prefix-sharing order.

Usage::

    from contextpilot_mem0 import ContextPilotMemory, format_memories

    memory = ContextPilotMemory(Memory.from_config(config))
    found = memory.search(question, filters={"user_id": "alice"}, top_k=5)
    section = format_memories(found)

``search`` returns mem0's own response with its ``results`` reordered (memories an
earlier prompt already sent first, in the cached order) and annotated; everything else
passes through to the wrapped memory. See ``docs/integrations/mem0.md``.
"""

from ._errors import Mem0ResponseError
from ._format import format_memories
from ._memory import AsyncContextPilotMemory, ContextPilotMemory
from ._results import ANNOTATION_KEY, memory_block_id
from ._scope import scope_tenant

__version__ = "0.1.0"

__all__ = [
    "ANNOTATION_KEY",
    "AsyncContextPilotMemory",
    "ContextPilotMemory",
    "Mem0ResponseError",
    "__version__",
    "format_memories",
    "memory_block_id",
    "scope_tenant",
]
