"""Joining and leaving LiteLLM's callbacks.

LiteLLM copies each entry of ``litellm.callbacks`` into its success and failure lists
when a call starts, and keeps a single ``CustomLogger`` per class and public settings.
So every logger of this package carries a ``callback_id`` of its own (two strategies of
two routers both hear of their calls), and leaving removes it from every list, not only
from ``litellm.callbacks`` (else it would go on hearing of every call).

The proxy also tells its callbacks when a request has failed, after its retries and
fallbacks (``async_post_call_failure_hook``): the one end of such a request that LiteLLM
always reports, since a proxy request logs only its first failed attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import litellm
from litellm.integrations.custom_logger import CustomLogger

__all__ = ["ProxyFailureLogger", "add_callback", "remove_callback"]

logger = logging.getLogger(__name__)


class ProxyFailureLogger(CustomLogger):
    """A LiteLLM callback told of the proxy's failed requests (:meth:`request_failed`)."""

    async def async_post_call_failure_hook(
        self, request_data: dict[str, Any], original_exception: Exception, *args: Any, **kwargs: Any
    ) -> None:
        """The proxy's hook (its other arguments, the caller's key and the traceback,
        unused): :meth:`request_failed`, never raising into the proxy."""
        try:
            if isinstance(request_data, Mapping):
                self.request_failed(request_data, original_exception)
        except Exception:
            logger.exception("%s: a failed request's cleanup failed", type(self).__name__)

    def request_failed(self, request: Mapping[str, Any], error: Exception) -> None:
        """A proxy request (its data, as the proxy holds it) failed for good with
        ``error``, or was refused before it was sent."""


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
