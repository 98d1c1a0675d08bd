"""The attempt loop of one call, sans I/O (the h11 / httpcore pattern).

:func:`attempt_loop` is a generator that performs no I/O. It yields *commands* —
:class:`Wait` (a held request waits for a release), :class:`Blocking` (make a call that
may block: a shared store's look-up, the pilot's feedback), :class:`Open` (send this
HTTP request), :data:`READ_BODY` / :data:`READ_TEXT` (the response's body, its next
text) — and text for the caller (a ``str``), and takes back what performing each one
gave: ``None`` after a wait or a delivery, the call's result, a :class:`Head` after an
open, the body's bytes, the next piece of text (``None`` at the end). A failure while
performing a command is thrown into it: the driver's HTTP error in the loop's terms
(:class:`TransportFailed`, or :class:`AttemptFailed` for a reply that does not
decode), or the caller's cancellation. Routing, holding, failover, stream resumption,
time bounds and feedback all happen here and in the :class:`~.dispatch.Dispatcher`,
once; the drivers (:mod:`.sync`, :mod:`.aio`) only perform commands, through
:class:`Steps`::

    steps, event = Steps(attempt_loop(dispatcher, spec, new_waiter)), None
    while (command := steps.send(event)) is not None:
        event = ...  # what performing it gave, or Raised(the exception it raised)
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ...errors import EndpointError, RoutingError
from ..prompt_keys import PromptInput
from .dispatch import Ask, Dispatcher, Plan
from .endpoints import Credentials, retry_after_s
from .holding import Held, NewWaiter, Waiter
from .results import Attempt, ChatResult
from .resume import Resume
from .sse import AttemptFailed, Kind, Lines, Reply, is_json, parse_body, parse_line

__all__ = [
    "READ_BODY",
    "READ_TEXT",
    "Blocking",
    "CallSpec",
    "Command",
    "Head",
    "Open",
    "Raised",
    "Steps",
    "TransportFailed",
    "Wait",
    "attempt_loop",
]

_RETRY_STATUS = {429, 500, 502, 503, 504}
_ENDPOINT_FAULT_STATUS = {401, 403, 404}  # the endpoint's credentials, path or model
_DEADLINE_SLACK_S = 0.005  # a read timed out this close to the deadline was cut by it


@dataclass(frozen=True)
class Wait:
    """Wait until ``waiter`` is woken or ``timeout_s`` passes; answer ``None``."""

    waiter: Waiter
    timeout_s: float


@dataclass(frozen=True)
class Blocking:
    """Call ``run`` and answer what it returns. It may block (a store round trip, a
    lock), so a driver on an event loop calls it in a worker thread."""

    run: Callable[[], object]


@dataclass(frozen=True)
class Open:
    """Send ``POST url`` with the JSON ``body`` and ``headers``, each network wait
    bounded by ``timeout_s``; answer its :class:`Head`. The response stays open until
    the loop asks for something other than its body."""

    url: str
    body: dict[str, Any]
    headers: Mapping[str, str] = field(repr=False)  # an API key: never in a traceback
    timeout_s: float


class _Read:
    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"READ_{self.what.upper()}"


READ_BODY = _Read("body")  # answer: the whole body (bytes)
READ_TEXT = _Read("text")  # answer: the next text the body decodes to (str), None after it

Command = Wait | Blocking | Open | _Read


@dataclass(frozen=True)
class Head:
    """The status and headers of a response."""

    status: int
    headers: Mapping[str, str]


class TransportFailed(AttemptFailed):
    """No exchange with the endpoint (the driver's HTTP error, in the loop's terms).
    ``timed_out``: a connect or read timeout; ``remote_protocol``: the server broke the
    protocol, e.g. closed a pooled connection without answering."""

    def __init__(self, message: str, *, timed_out: bool, remote_protocol: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.remote_protocol = remote_protocol


class _DeadlinePassed(Exception):
    """The call's ``deadline_s`` passed while an attempt was streaming."""


@dataclass
class CallSpec:
    """One call as its caller asks it: ``prompt`` and engine ``params`` for ``kind``;
    ``streaming``: text is handed out as it arrives (a retry must resume after it).
    ``logical_id``, ``excluded``, ``first_attempt`` and ``failures`` continue an
    earlier call (:meth:`RoutingClient.solve`). The answer is appended to ``holder``."""

    kind: Kind
    prompt: PromptInput
    params: Mapping[str, Any]
    streaming: bool = False
    logical_id: str | None = None
    excluded: frozenset[tuple[str, str]] = frozenset()
    first_attempt: int = 0
    failures: list[Attempt] | None = None
    holder: list[ChatResult] = field(default_factory=list)


Loop = Generator[Command | str, Any, None]


def attempt_loop(dispatcher: Dispatcher, spec: CallSpec, new_waiter: NewWaiter) -> Loop:
    """The attempts of one call, until one answers (appended to ``spec.holder``); a
    retryable failure excludes its ``(endpoint, model)`` and tries again, at most
    ``max_attempts`` times, else :class:`RoutingError`."""
    call = _Call(dispatcher, spec)
    for attempt in range(spec.first_attempt, spec.first_attempt + call.max_attempts):
        plan = yield from _dispatch(call, attempt, new_waiter)
        reply = Reply()
        try:
            yield from _exchange(call, plan, reply)
        except (AttemptFailed, _DeadlinePassed) as exc:
            call.failed(plan, reply, exc)
            continue
        except BaseException:
            dispatcher.finish(plan, reply, "cancelled", cancelled=True)
            raise
        answer = dispatcher.succeeded(plan, reply)
        feedback = dispatcher.pilot_feedback(answer, spec.prompt)
        if feedback is not None:
            yield Blocking(feedback)
        spec.holder.append(answer)
        return
    raise call.exhausted()


def _dispatch(
    call: _Call, attempt: int, new_waiter: NewWaiter
) -> Generator[Command | str, Any, Plan]:
    """Route one attempt, after the store's look-up of its unknown prefixes (if any),
    waiting while the policy holds it (late binding), until the call's deadline at
    most."""
    call.check_deadline()
    dispatcher, excluded = call.dispatcher, call.excluded
    if call.retry_on is not None:  # a stale connection: the same endpoint again
        replicas = dispatcher.replicas.values()
        excluded |= {(r.replica_id, r.model) for r in replicas} - {call.retry_on}
        call.retry_on = None
    request = dispatcher.route_request(call.ask, call.logical_id, attempt, excluded)
    look_up = dispatcher.look_up(request)
    found = [] if look_up is None else (yield Blocking(look_up))
    plan = dispatcher.plan(call.ask, request, found, new_waiter)
    try:
        while isinstance(plan, Held):
            yield Wait(plan.waiter, call.capped(plan.wait_s))
            call.check_deadline()
            plan = dispatcher.resume(call.ask, plan)
    except BaseException:
        if isinstance(plan, Held):
            dispatcher.abandon(call.ask, plan)
        raise
    return plan


def _exchange(call: _Call, plan: Plan, reply: Reply) -> Generator[Command | str, Any, None]:
    """One HTTP exchange; yields the text new to the caller. An answer is complete
    with ``[DONE]`` and at least the text already delivered."""
    call.resume.restart()
    head: Head = yield call.open(plan)
    reply.responded = True
    if head.status >= 400:
        call.rejected(plan, head, (yield READ_BODY))
    kind = call.ask.kind
    if is_json(head.headers):
        new = call.deliver(plan, reply, parse_body(kind, (yield READ_BODY), reply))
        if new:
            yield new
    else:
        watch, lines = _Watch(plan.started, call.timeout_s, call.deadline), Lines()
        while (text := (yield READ_TEXT)) is not None:
            yield from _events(call, plan, reply, watch, lines.feed(text))
        yield from _events(call, plan, reply, watch, lines.flush())
    if not reply.done:
        raise AttemptFailed("the stream ended before [DONE]")
    call.resume.finish()


def _events(
    call: _Call, plan: Plan, reply: Reply, watch: _Watch, lines: list[str]
) -> Generator[str, Any, None]:
    """Take the event stream's next ``lines``; yields the text new to the caller."""
    kind = call.ask.kind
    for line in lines:
        watch.line(line)
        if line:  # a blank line only ends an event
            new = call.deliver(plan, reply, parse_line(kind, line, reply))
            if new:
                yield new


class _Watch:
    """The time bounds of one streamed attempt, checked at every line: at most
    ``timeout_s`` since dispatch or the last event (SSE comments and blank
    keep-alive lines are no progress), and the call's deadline. A server that sends
    nothing at all is cut by the driver's per-read timeout (:attr:`Open.timeout_s`)."""

    __slots__ = ("deadline", "last_event", "timeout_s")

    def __init__(self, started: float, timeout_s: float, deadline: float) -> None:
        self.last_event = started
        self.timeout_s = timeout_s
        self.deadline = deadline

    def line(self, line: str) -> None:
        now = time.monotonic()
        if now >= self.deadline:
            raise _DeadlinePassed
        if line.startswith("data:"):
            self.last_event = now
        elif now - self.last_event > self.timeout_s:
            raise AttemptFailed(f"no event for {self.timeout_s} s (only keep-alives)")


class _Call:
    """What one call carries across its attempts: what it asks, its id, the pairs it
    excludes, the failed attempts so far, the stream delivered, its deadline."""

    __slots__ = (
        "ask",
        "deadline",
        "deadline_s",
        "dispatcher",
        "errors",
        "excluded",
        "logical_id",
        "max_attempts",
        "max_backoff_s",
        "resume",
        "retry_on",
        "timeout_s",
    )

    def __init__(self, dispatcher: Dispatcher, spec: CallSpec) -> None:
        config = dispatcher.config
        self.dispatcher = dispatcher
        self.ask = Ask.of(spec.kind, spec.prompt, spec.params, dispatcher.template)
        self.logical_id = spec.logical_id or uuid.uuid4().hex
        self.excluded = spec.excluded
        self.retry_on: tuple[str, str] | None = None  # the next attempt's only pair
        self.errors = spec.failures if spec.failures is not None else []
        self.resume = Resume(spec.streaming)
        self.timeout_s, self.max_attempts = config.timeout_s, config.max_attempts
        self.deadline_s, self.max_backoff_s = config.deadline_s, config.max_backoff_s
        self.deadline = math.inf if self.deadline_s is None else time.monotonic() + self.deadline_s

    def check_deadline(self) -> None:
        if time.monotonic() >= self.deadline:
            raise self._timed_out()

    def capped(self, wait_s: float) -> float:
        """``wait_s``, or less to wake up at the deadline."""
        return min(wait_s, max(self.deadline - time.monotonic(), 0.0))

    def open(self, plan: Plan) -> Open:
        timeout_s = self.timeout_s
        if self.deadline < math.inf:  # no single read may outlast the call's deadline
            timeout_s = min(timeout_s, max(self.deadline - time.monotonic(), _DEADLINE_SLACK_S))
        headers = Credentials.of(plan.replica.endpoint).headers
        return Open(plan.url, plan.body, headers, timeout_s)

    def rejected(self, plan: Plan, head: Head, body: bytes) -> NoReturn:
        """An error answer: the endpoint's fault, tried elsewhere — a 5xx/429 (keeping
        the endpoint out for its ``Retry-After``, at most ``max_backoff_s``), a
        401/403/404 (its key, path or model is wrong: every request would fail there) —
        or the caller's (:class:`EndpointError`)."""
        status = head.status
        text = Credentials.of(plan.replica.endpoint).scrub(body.decode(errors="replace"))
        if status in _RETRY_STATUS:
            retry_after = head.headers.get("retry-after")
            plan.retry_after_s = retry_after_s(retry_after, self.max_backoff_s)
            raise AttemptFailed(f"HTTP {status} from {plan.url}")
        if status in _ENDPOINT_FAULT_STATUS:
            raise AttemptFailed(f"HTTP {status} from {plan.url}: {text[:200]}")
        self.dispatcher.finish(plan, None, f"HTTP {status}", cancelled=True, result="rejected")
        reason = text[:200]
        raise EndpointError(f"{plan.url} answered HTTP {status}: {reason}", status, reason)

    def deliver(self, plan: Plan, reply: Reply, piece: str) -> str:
        """Take ``piece`` of the answer; the text new to the caller (may be empty).
        The first content or tool-call fragment is the first token."""
        if reply.first_token_at is None and (piece or reply.tool_calls):
            reply.first_token_at = time.monotonic()
            self.dispatcher.first_token(plan)
        if not piece:
            return ""
        reply.text.append(piece)
        return self.resume.feed(piece)

    def failed(self, plan: Plan, reply: Reply, exc: Exception) -> None:
        """Book a retryable failure and exclude its pair from the next attempts;
        :class:`RoutingError` when the deadline cut it (breaker untouched: the caller's
        budget ran out, not the endpoint).

        A connection the server closed before answering (a pooled keep-alive
        connection it had already timed out) is not the endpoint's fault: the first
        such failure of a call retries the same endpoint, breaker untouched."""
        if self._cut_by_deadline(exc):
            raise self._deadline_passed(plan, reply) from None
        endpoint = plan.replica.endpoint
        described = str(exc) if isinstance(exc, TransportFailed) else f"{type(exc).__name__}: {exc}"
        error = Credentials.of(endpoint).scrub(described)
        stale = isinstance(exc, TransportFailed) and exc.remote_protocol and not reply.responded
        if stale and self.resume.stale_retry:
            self.resume.stale_retry = False
            self.retry_on = (plan.decision.replica_id, plan.decision.model)
            self.dispatcher.finish(plan, reply, error, cancelled=True, result="stale")
        else:
            stale = False
            self.dispatcher.finish(plan, reply, error)
        self._failure(plan, error)
        if not stale:
            self.excluded |= {(plan.decision.replica_id, plan.decision.model)}

    def _failure(self, plan: Plan, error: str) -> None:
        latency_s = time.monotonic() - plan.started
        self.errors.append(
            Attempt(plan.replica.endpoint.display_url, plan.replica.model, latency_s, error)
        )

    def _cut_by_deadline(self, exc: Exception) -> bool:
        if isinstance(exc, _DeadlinePassed):
            return True
        cut = isinstance(exc, TransportFailed) and exc.timed_out
        return cut and time.monotonic() + _DEADLINE_SLACK_S >= self.deadline

    def _deadline_passed(self, plan: Plan, reply: Reply) -> RoutingError:
        """End the attempt in flight at the deadline."""
        self.dispatcher.finish(plan, reply, "deadline passed", cancelled=True, result="deadline")
        self._failure(plan, "deadline passed")
        return self._timed_out()

    def _timed_out(self) -> RoutingError:
        return RoutingError(
            f"the deadline of {self.deadline_s} s passed after {len(self.errors)} attempts",
            self.errors,
        )

    def exhausted(self) -> RoutingError:
        last = self.errors[-1].error if self.errors else "no attempt"
        return RoutingError(f"all {self.max_attempts} attempts failed; last: {last}", self.errors)


class Raised:
    """What a driver answers when performing a command raised ``exc`` (an HTTP error
    translated to :class:`TransportFailed` or :class:`AttemptFailed`, or the caller's
    cancellation): the loop gets ``exc`` thrown in where it waits."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Steps:
    """A driver's handle on an attempt loop: :meth:`send` gives it what performing the
    last command gave and returns the next command, or a ``str`` to hand to the caller.
    An exception of the call itself propagates from :meth:`send`."""

    __slots__ = ("_loop",)

    def __init__(self, loop: Loop) -> None:
        self._loop = loop

    def send(self, event: object) -> Command | str | None:
        """``event``: ``None`` to start and after a wait or a delivery, else the answer
        to the last command or a :class:`Raised`. ``None`` once the call ended."""
        try:
            if type(event) is Raised:
                return self._loop.throw(event.exc)
            return self._loop.send(event)
        except StopIteration:
            return None
