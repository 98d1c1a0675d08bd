"""Errors as the proxy answers them: :class:`ApiError`, an HTTP status with OpenAI's
error object (``{"error": {"message", "type", "param", "code"}}``), and the mapping of
the library's typed errors onto it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import (
    BlockConflictError,
    ContextPilotError,
    ConversationConflictError,
    ConversationStateError,
    EmptyContextError,
    EndpointError,
    InvalidInputError,
    InvalidRouteRequestError,
    NoReplicaAvailableError,
    OversizeBlockError,
    RoutingError,
    StoreUnavailableError,
    UnknownConversationError,
)

__all__ = ["FIELD_ERROR", "ApiError", "pilot_error_of", "routing_error_of"]

FIELD_ERROR = "invalid_contextpilot_field"
"""The ``code`` of a 400 answer to a malformed ``contextpilot`` request field."""

_INVALID = "invalid_request_error"
_RETRY = {"Retry-After": "1"}


class ApiError(Exception):
    """An answer other than a completion: ``status`` and OpenAI's error fields.
    ``headers`` go with the response (``Retry-After``, ``WWW-Authenticate``)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = _INVALID,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The JSON error object, as the OpenAI API writes it."""
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return {"error": error}

    @classmethod
    def invalid(
        cls, message: str, *, param: str | None = None, code: str | None = None
    ) -> ApiError:
        """A malformed request (HTTP 400)."""
        return cls(400, message, param=param, code=code)


def pilot_error_of(exc: ContextPilotError) -> ApiError:
    """The answer for an error ``ContextPilot.optimize`` raised (before it changed any
    state): the request's ``contextpilot`` field was unusable, or the conversation
    store is down (503: nothing was recorded, try again; the store's address is not
    shown)."""
    if isinstance(exc, StoreUnavailableError):
        return _store_unavailable()
    if isinstance(exc, ConversationConflictError):
        message = "the conversation kept changing under this turn; nothing was recorded, try again"
        param = "contextpilot.conversation_id"
        return ApiError(409, message, param=param, code="conversation_conflict", headers=_RETRY)
    if isinstance(exc, (ConversationStateError, UnknownConversationError)):
        param = "contextpilot.conversation_id"
        return ApiError(409, str(exc), param=param, code="conversation_state")
    if isinstance(exc, OversizeBlockError):
        return ApiError.invalid(str(exc), param="contextpilot.documents", code="document_too_long")
    if isinstance(exc, (InvalidInputError, EmptyContextError, BlockConflictError)):
        return ApiError.invalid(str(exc), param="contextpilot", code=FIELD_ERROR)
    return ApiError(500, f"internal error: {type(exc).__name__}", type="server_error")


def routing_error_of(exc: ContextPilotError, *, fleet_down: bool) -> ApiError:
    """The answer for an error of the routing client. ``fleet_down``: every replica's
    circuit breaker is open, so a :class:`RoutingError` is HTTP 503 (come back later)
    rather than 502 (this request failed upstream).

    A client learns that the fleet failed, not how: the engines' URLs and their error
    answers (a 401's body may quote the proxy's engine credentials) stay in the proxy's
    log. An engine's refusal of the request itself (:class:`EndpointError`) passes on
    its status and the start of its answer, without the engine's URL."""
    if isinstance(exc, RoutingError):
        if fleet_down:
            message = "no replica of the fleet is available; try again later"
            return ApiError(
                503, message, type="server_error", code="fleet_unavailable", headers=_RETRY
            )
        message = "the fleet failed to answer this request"
        return ApiError(502, message, type="server_error", code="upstream_error")
    if isinstance(exc, NoReplicaAvailableError):
        message = "no replica of the fleet is available; try again later"
        return ApiError(503, message, type="server_error", code="fleet_unavailable", headers=_RETRY)
    if isinstance(exc, EndpointError):  # the engine refused the request itself
        status = exc.status if 400 <= exc.status < 500 else 502
        message = f"the engine refused the request (HTTP {exc.status}): {exc.reason}"
        return ApiError(status, message, code="upstream_rejected")
    if isinstance(exc, (InvalidInputError, InvalidRouteRequestError)):  # a parameter
        return ApiError.invalid(str(exc))
    return pilot_error_of(exc)  # the pilot's errors (a shared store's among them)


def _store_unavailable() -> ApiError:
    """A shared store is down (503, try again; its address is not shown)."""
    message = "the conversation store is unavailable; nothing was recorded, try again"
    return ApiError(503, message, type="server_error", code="store_unavailable", headers=_RETRY)
