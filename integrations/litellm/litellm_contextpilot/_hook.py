"""The pilot as a LiteLLM hook: a request that carries its documents in the
``contextpilot`` field (:mod:`._field`) is sent with the pilot's prompt — documents
reordered to reuse the prefix an earlier prompt left in the engine's cache, repeats of
the conversation replaced by location notes, notes restoring the retriever's ranking —
instead of its own messages. A request without the field passes untouched.

On the LiteLLM proxy the hook runs as ``async_pre_call_hook`` (before the request is
routed, so the routing strategy sees the final prompt); with the Python SDK, pass the
request's keyword arguments through :meth:`ContextPilotHook.apply` before
``router.acompletion(**kwargs)``. Either way, with the hook among LiteLLM's callbacks,
the answer is recorded as the conversation's turn when the call succeeds, and the
engine's cache report corrects the pilot's index. A call that fails for good (every
retry and fallback failed) is evicted from the pilot's index, since no engine cached its
prompt; its turn stays in the conversation, unanswered (as ``contextpilot-rag serve``
leaves it). A failure counts as final once the call is over (:mod:`._failed_calls`), or
when the proxy reports the request failed (``async_post_call_failure_hook``: a proxy
request logs only the first of its failed attempts, so a retry that fails is not heard of).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from contextpilot_rag import ConfigError, ContextPilot, ContextPilotError, Prompt
from contextpilot_rag.serve.api_errors import pilot_error_of

from ._callbacks import ProxyFailureLogger, add_callback, remove_callback
from ._events import (
    PILOT_KEY,
    PilotStamp,
    answer_text,
    cache_usage,
    drop_stamps,
    logged_metadata,
    request_metadata,
    sent_metadata,
)
from ._failed_calls import FailedCalls
from ._field import pop_field, read_pilot_request

__all__ = ["ContextPilotHook"]

logger = logging.getLogger(__name__)


class ContextPilotHook(ProxyFailureLogger):
    """Applies a :class:`~contextpilot_rag.ContextPilot` (``pilot``, default
    ``ContextPilot(store=store)``) to requests that carry documents in the
    ``contextpilot`` field, and records their answers.

    A request's tenant is the field's ``tenant``, else ``tenant``: the pilot keeps
    each tenant's index, conversations and de-duplication apart (``docs/tenants.md``).
    ``send_cache_salt``: add the prompt's ``cache_salt`` to the request
    (``extra_body``), for engines with a salted prefix cache (vLLM); others may refuse
    the unknown field. At most ``max_pending`` prompts await their answer (the oldest
    is forgotten first: its answer is then not recorded). A call that failed for good
    is forgotten, and its prompt evicted from the pilot's index, once its caller is past
    it: when the task that made it ends, or when the same task (or thread) calls
    :meth:`apply` again; a failed attempt that a retry or fallback follows is not.
    """

    def __init__(
        self,
        pilot: ContextPilot | None = None,
        *,
        store: Any = None,
        tenant: str | None = None,
        send_cache_salt: bool = False,
        max_pending: int = 10_000,
    ) -> None:
        super().__init__()
        self.callback_id = uuid.uuid4().hex  # see ._callbacks
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ConfigError(f"max_pending must be an integer >= 1, got {max_pending!r}")
        if pilot is not None and store is not None:
            raise ConfigError("give the pilot its store yourself: pilot= or store=, not both")
        self.pilot = pilot if pilot is not None else ContextPilot(store=store)
        self.tenant = tenant
        self.send_cache_salt = send_cache_salt
        self._max_pending = max_pending
        self._pending: OrderedDict[str, Prompt] = OrderedDict()
        self._lock = threading.Lock()
        self._failed = FailedCalls(self._failed_for_good)  # its lock is taken after ours

    def attach(self) -> ContextPilotHook:
        """Join LiteLLM's callbacks (``litellm.callbacks``), to hear of the answers."""
        add_callback(self)
        return self

    def detach(self) -> None:
        """Leave LiteLLM's callbacks."""
        remove_callback(self)

    # -- the request ---------------------------------------------------------------------

    def apply(self, data: dict[str, Any]) -> dict[str, Any]:
        """Rewrite a request's keyword arguments in place (and return them): with the
        ``contextpilot`` field, ``messages`` become the pilot's prompt and the field is
        removed; without it, nothing changes. Raises
        :class:`~contextpilot_rag.errors.InvalidInputError` for a malformed field (the
        request is refused; nothing is recorded)."""
        self._failed.caller_moved_on()  # its earlier calls are over
        drop_stamps(data)  # only this hook stamps a prompt: never trust a client's
        field = pop_field(data)
        if field is None:
            return data
        request = read_pilot_request(field, data.get("messages"))
        tenant = request.tenant or self.tenant
        prompt = self.pilot.optimize(
            list(request.documents),
            request.query,
            conversation_id=request.conversation_id,
            system=request.system,
            tenant=tenant,
        )
        data["messages"] = [dict(message) for message in prompt.messages]
        extras = prompt.request_extras() if self.send_cache_salt else {}
        if extras:
            data["extra_body"] = {**(data.get("extra_body") or {}), **extras}
        request_metadata(data)[PILOT_KEY] = PilotStamp(
            {
                "request_id": prompt.request_id,
                "conversation_id": request.conversation_id,
                "tenant": tenant,
                # unsalted where salts are sent: one cache entry (and route) for all tenants
                "public": self.send_cache_salt and tenant is not None and not extras,
                "boundaries": [[b.message_index, b.char_end] for b in prompt.boundaries],
            }
        )
        with self._lock:
            self._pending[prompt.request_id] = prompt
            while len(self._pending) > self._max_pending:
                self._failed.discard(self._pending.popitem(last=False)[0])
        return data

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any]:
        """The proxy's hook: :meth:`apply`, off the event loop (tokenizing new
        documents takes a while). The pilot's errors get the status
        ``contextpilot-rag serve`` answers them with (a malformed field: 400; a
        conversation in the wrong state: 409; the store down: 503), raised as
        ``fastapi.HTTPException``, LiteLLM's documented way to refuse a request from a
        call hook: the proxy sends the status and message on (any other exception is
        a 500)."""
        try:
            return await asyncio.to_thread(self.apply, data)
        except ContextPilotError as exc:
            refusal = _refusal(exc)
            if refusal is None:
                raise
            raise refusal from exc

    # -- the answer ----------------------------------------------------------------------

    async def async_log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self.record(kwargs, response_obj)

    def log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self.record(kwargs, response_obj)

    def record(self, kwargs: Mapping[str, Any], response: object) -> bool:
        """After a successful call: its answer becomes the conversation's turn (paired
        with the exact prompt sent) and its cache report goes to the pilot. Returns
        whether the call was one of this hook's; never raises into LiteLLM."""
        request_id = _stamped_request_id(kwargs)
        if request_id is None:
            return False
        self._failed.discard(request_id)
        with self._lock:
            prompt = self._pending.pop(request_id, None)
        if prompt is None:
            return False
        try:
            self._answered(self.pilot, prompt, response)
        except Exception:
            logger.exception("ContextPilotHook: recording the answer to %s failed", request_id)
        return True

    @staticmethod
    def _answered(pilot: ContextPilot, prompt: Prompt, response: object) -> None:
        text = answer_text(response)
        if prompt.conversation_id is not None and text is not None:
            pilot.record_answer(prompt, text)
        usage = cache_usage(response)
        if usage is not None and usage.prompt_tokens > 0:
            pilot.observe_cache(prompt, usage.cached_tokens, usage.prompt_tokens)

    # -- failures ------------------------------------------------------------------------

    async def async_log_failure_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._attempt_failed(kwargs)

    def log_failure_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._attempt_failed(kwargs)

    def log_pre_api_call(self, model: Any, messages: Any, kwargs: Any) -> None:
        """An attempt starts: a retry or fallback of a failed one keeps its prompt."""
        request_id = _stamped_request_id(kwargs)
        if request_id is not None:
            self._failed.discard(request_id)

    def _attempt_failed(self, kwargs: object) -> None:
        """An attempt of one of this hook's calls failed: held until its call is over
        (a retry or fallback may still answer it)."""
        request_id = _stamped_request_id(kwargs)
        if request_id is None:
            return
        with self._lock:
            if request_id not in self._pending:
                return
        self._failed.failed(request_id)

    def request_failed(self, request: Mapping[str, Any], error: Exception) -> None:
        """On the proxy, a request that failed (after its retries and fallbacks, or
        refused before any): its call is over, without an answer. Only the hook's own
        stamp counts: a request refused before the hook ran carries the client's."""
        stamp = sent_metadata(request).get(PILOT_KEY)
        request_id = _request_id_of(stamp) if isinstance(stamp, PilotStamp) else None
        if request_id is not None:
            self._failed.discard(request_id)
            self._failed_for_good([request_id])

    def _failed_for_good(self, request_ids: list[str]) -> None:
        """Calls over without an answer: no engine cached their prompts. Never raises
        (it runs in LiteLLM's and asyncio's callbacks too)."""
        with self._lock:
            forgotten = [rid for rid in request_ids if self._pending.pop(rid, None) is not None]
        if not forgotten:
            return
        try:
            self.pilot.evict(forgotten)
        except Exception:
            logger.exception("ContextPilotHook: evicting the failed requests %s failed", forgotten)

    @property
    def pending(self) -> int:
        """Prompts sent whose answer has not been recorded (a call that failed counts
        until it is known to be over)."""
        with self._lock:
            return len(self._pending)


def _stamped_request_id(kwargs: object) -> str | None:
    """The request id the hook stamped on a logged call, if any."""
    if not isinstance(kwargs, Mapping):
        return None
    return _request_id_of(logged_metadata(kwargs).get(PILOT_KEY))


def _request_id_of(stamp: object) -> str | None:
    request_id = stamp.get("request_id") if isinstance(stamp, Mapping) else None
    return request_id if isinstance(request_id, str) else None


def _refusal(error: ContextPilotError) -> Exception | None:
    """The proxy's answer to ``error`` as ``serve`` maps it (FastAPI is there wherever
    the proxy runs); ``None`` for a server error, or without FastAPI (not on a proxy),
    where the error itself is the one to raise."""
    answer = pilot_error_of(error)
    if answer.status >= 500 and answer.status != 503:
        return None
    try:
        fastapi = importlib.import_module("fastapi")
    except ImportError:
        return None
    refusal: Exception = fastapi.HTTPException(
        status_code=answer.status, detail=answer.message, headers=answer.headers or None
    )
    return refusal
