"""Joining and leaving LiteLLM's callbacks.

LiteLLM copies each entry of ``litellm.callbacks`` into its success and failure lists
when a call starts, and keeps a single ``CustomLogger`` per class and public settings.
So every logger of this package carries a ``callback_id`` of its own (two strategies of
two routers both hear of their calls), and leaving removes it from every list, not only
from ``litellm.callbacks`` (else it would go on hearing of every call).
"""

from __future__ import annotations

import litellm
from litellm.integrations.custom_logger import CustomLogger

__all__ = ["add_callback", "remove_callback"]


def add_callback(callback: CustomLogger) -> None:
    """Append ``callback`` to ``litellm.callbacks`` unless it is there already."""
    if callback not in litellm.callbacks:
        litellm.callbacks.append(callback)


def remove_callback(callback: CustomLogger) -> None:
    """Take ``callback`` off ``litellm.callbacks`` and off the lists LiteLLM promoted it to."""
    manager = getattr(litellm, "logging_callback_manager", None)
    remove_everywhere = getattr(manager, "remove_callback_from_all_lists", None)
    if remove_everywhere is not None:
        remove_everywhere(callback)
    while callback in litellm.callbacks:
        litellm.callbacks.remove(callback)
