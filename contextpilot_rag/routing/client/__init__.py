"""``RoutingClient``: an OpenAI-compatible client that routes every request over a fleet
of endpoints with a routing policy and feeds what the engines report back to it.

::

    client = RoutingClient(["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"],
                           model="qwen2.5-7b", policy="combined")
    result = client.chat(pilot.optimize(question, blocks))   # a Prompt or chat messages
    result.text, result.endpoint, result.ttft_s, result.cached_tokens

Every request is streamed from the engine (also by :meth:`RoutingClient.chat`), so
TTFT is measured at the first content token (an engine that ignores ``stream`` and
answers one JSON object is read whole). Per endpoint the client keeps live
``in_flight`` and ``queued_tokens`` counters (a prompt is queued from dispatch to its
first token) on every path — success, failure, timeout, cancellation — and a circuit
breaker: a transport error, a 5xx/429/401/403/404 answer or a malformed reply opens it
for an exponentially growing backoff (or the answer's ``Retry-After``, seconds or an
HTTP-date, if longer; at most ``max_backoff_s`` either way), after which one request may
try again.

Feedback: the engine's ``usage.prompt_tokens_details.cached_tokens`` (vLLM, SGLang,
OpenAI) or ``timings.cache_n`` (llama-server) goes to ``policy.observe`` with the
measured TTFT and end-to-end time, which trims routes the engine disproved; its
``usage.prompt_tokens`` refines the character-per-token estimate of the route keys
(:mod:`~contextpilot_rag.routing.prompt_keys`).

Failures: a transport error, a 5xx/429 answer, a 401/403/404 (the endpoint's key, path
or model is wrong), a reply of the wrong shape (JSON that is not the OpenAI format) or
one that does not decode, ``timeout_s`` without a stream event (SSE keep-alive comments
are no progress) or a stream that ends early makes the client retry on another
``(endpoint, model)`` (the failed one excluded) up to ``max_attempts``. A stream
(:meth:`RoutingClient.stream`) already partly delivered resumes after the delivered
text when the retry reproduces it, and fails with :class:`RoutingError` when it
diverges or ends shorter: the caller never gets less than it was given. ``chat`` and
``complete`` have delivered nothing, so they take the retry's whole answer. With
``deadline_s`` no call (all its attempts and waits) outlasts it: :class:`RoutingError`.
Other 4xx answers are the caller's error and raise :class:`EndpointError` at once.
Credentials in a base URL (``http://user:key@host/v1``, sent as HTTP basic auth) and API
keys never appear in results, errors, logs or metrics: the URL shows as
:attr:`Endpoint.display_url` (``http://***@host/v1``).
:meth:`RoutingClient.solve` retries until ``verify`` accepts an answer, excluding each
``(endpoint, model)`` already tried, and reports the time to a correct answer.

Shared state: with ``store=`` (``redis://…``, ``sqlite:///…`` or a
:class:`~contextpilot_rag.routing.route_store.RouteStore`) clients in several processes
share learned routes (another process's route is a hint of lower trust than the
client's own) and replica load; a request's unknown prefixes are looked up once before
its decision (an async call waits for the look-up in a worker thread, never on the
event loop), everything else is published in the background, and with the store down
the client routes on its own state (:mod:`~contextpilot_rag.routing.shared_routes`).

The parts, each a module: ``config`` (:class:`ClientConfig`), ``endpoints`` (endpoints,
credentials, per-replica runtime), ``sse`` (reading answers), ``holding`` (held requests),
``dispatch`` (routing and feedback, the one owner of the fleet's live state), ``resume``
(a stream across retries), ``attempts`` (the attempt loop, sans I/O), ``sync`` / ``aio``
(the drivers that perform its I/O), ``solving``, ``results``, ``routing_client`` (the
facade) and ``wrappers`` (for framework adapters).
"""

from __future__ import annotations

from ...errors import EndpointError, RoutingError
from .config import ClientConfig
from .endpoints import Endpoint
from .results import AsyncChatStream, Attempt, ChatResult, ChatStream, SolveResult
from .routing_client import RoutingClient
from .wrappers import OwnedClient, client_source

__all__ = [
    "AsyncChatStream",
    "Attempt",
    "ChatResult",
    "ChatStream",
    "ClientConfig",
    "Endpoint",
    "EndpointError",
    "OwnedClient",
    "RoutingClient",
    "RoutingError",
    "SolveResult",
    "client_source",
]
