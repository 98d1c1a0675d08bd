"""litellm_contextpilot with a real ``litellm.Router`` over loopback OpenAI-compatible
engines (each with its own prefix cache), fully offline: ``openai/<model>`` deployments
with the engines' ``api_base``, LiteLLM's bundled model-cost map, no telemetry."""

from __future__ import annotations

import asyncio
import copy
import datetime
import importlib.metadata
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # read by litellm at import time
os.environ["MEM0_TELEMETRY"] = "False"

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "integrations" / "litellm") not in sys.path:  # until the package is installed
    sys.path.insert(0, str(ROOT / "integrations" / "litellm"))

import pytest  # noqa: E402

litellm = pytest.importorskip(
    "litellm",
    reason="litellm is not installed (pip install -e 'integrations/litellm[litellm]')",
)

from litellm.integrations.custom_logger import CustomLogger  # noqa: E402
from litellm.router import Router  # noqa: E402
from litellm_contextpilot import (  # noqa: E402
    ContextPilotHook,
    ContextPilotRoutingStrategy,
    FleetConfig,
)
from litellm_contextpilot._callbacks import add_callback, remove_callback  # noqa: E402
from litellm_contextpilot._fleet import Fleet  # noqa: E402
from litellm_contextpilot._keys import RouteKeys  # noqa: E402

from contextpilot_rag.errors import ConfigError, InvalidInputError  # noqa: E402
from contextpilot_rag.routing import Decision, Outcome, RouteRequest  # noqa: E402
from contextpilot_rag.routing.route_store import MemoryRouteStore  # noqa: E402
from contextpilot_rag.testing import CloudCacheServer, OpenAICompatibleServer  # noqa: E402

MODEL = "rag-model"
NAMES = ("a", "b", "c")
DOCUMENTS = [
    {"id": f"doc{i}", "text": f"Document {i} explains topic {i} in detail. " * 30} for i in range(9)
]


def reply_of(name: str) -> str:
    return f"answer from server {name}"


Run = Callable[[Coroutine[Any, Any, Any]], Any]


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    """Runs coroutines on one event loop for the whole module: LiteLLM's logging worker
    (which delivers the success and failure callbacks) stays bound to the loop it first
    ran on, as in an application, which has one."""
    loop = asyncio.new_event_loop()
    yield loop.run_until_complete
    # closed as asyncio.run closes its loop: the logging worker still waits on its queue,
    # and a task left pending on a closed loop is collected at interpreter exit, where some
    # LiteLLM releases (1.84 among them) crash the process
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:  # gather() of nothing would be a future of another loop
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


@pytest.fixture
def fleet() -> Iterator[list[OpenAICompatibleServer]]:
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                OpenAICompatibleServer(model=MODEL, reply=lambda _m, n=name: reply_of(n))
            )
            for name in NAMES
        ]


def deployment(url: str, model_name: str = MODEL) -> dict[str, Any]:
    return {
        "model_name": model_name,
        "litellm_params": {"model": f"openai/{MODEL}", "api_base": url, "api_key": "loopback"},
    }


def router_over(servers: list[OpenAICompatibleServer], **options: Any) -> Router:
    model_list = [deployment(server.base_url) for server in servers]
    return Router(model_list=model_list, num_retries=0, **options)


def dead_url() -> str:
    """The base URL of a server that has stopped: every call to it fails."""
    dead = OpenAICompatibleServer(model=MODEL).start()
    url = dead.base_url
    dead.stop()
    return url


def router_falling_back(primary: str, backup: str) -> Router:
    """``MODEL`` on ``primary``, falling back to the group ``backup`` on ``backup``."""
    model_list = [deployment(primary), deployment(backup, "backup")]
    return Router(model_list=model_list, num_retries=0, fallbacks=[{MODEL: ["backup"]}])


class Routed(NamedTuple):
    """A router over the fleet with the strategy and the hook attached."""

    fleet: list[OpenAICompatibleServer]
    router: Router
    strategy: ContextPilotRoutingStrategy
    hook: ContextPilotHook


@pytest.fixture
def policy(request: pytest.FixtureRequest) -> str:
    """The strategy's policy: ``combined`` unless a test asks for another."""
    return str(getattr(request, "param", "combined"))


@contextmanager
def routing(
    fleet: list[OpenAICompatibleServer],
    policy: str,
    hook: ContextPilotHook | None = None,
    **options: Any,
) -> Iterator[Routed]:
    router = router_over(fleet)
    strategy = ContextPilotRoutingStrategy(policy, **options).attach(router)
    hook = (hook or ContextPilotHook()).attach()
    try:
        yield Routed(fleet, router, strategy, hook)
    finally:
        strategy.detach()
        hook.detach()


@pytest.fixture
def routed(fleet: list[OpenAICompatibleServer], policy: str) -> Iterator[Routed]:
    with routing(fleet, policy) as routed:
        yield routed


class FakeClock:
    """The strategy's clock, moved by the test only."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Together:
    """Replies that hold the engines' answers to the first ``count`` requests until all
    of them have arrived: every one of them is routed while the others are in flight,
    however loaded the machine running the test is."""

    def __init__(self, count: int) -> None:
        self._barrier = threading.Barrier(count, timeout=30)
        self._left = count
        self._lock = threading.Lock()

    def reply(self, name: str) -> Callable[[list[dict[str, Any]]], str]:
        def answer(_messages: list[dict[str, Any]]) -> str:
            with self._lock:
                held, self._left = self._left > 0, self._left - 1
            if held:
                self._barrier.wait()
            return reply_of(name)

        return answer


def question(conversation: str, turn: int, documents: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Question {turn} of {conversation}?"}],
        "contextpilot": {"documents": documents, "conversation_id": conversation},
    }


async def ask(router: Router, data: dict[str, Any], *, stream: bool) -> str:
    """The answer's text, streamed or not."""
    if not stream:
        response = await router.acompletion(**data)
        return str(response.choices[0].message.content)
    chunks = await router.acompletion(**data, stream=True, stream_options={"include_usage": True})
    parts = [chunk.choices[0].delta.content or "" async for chunk in chunks if chunk.choices]
    return "".join(parts)


async def settled(
    strategy: ContextPilotRoutingStrategy | None, hook: ContextPilotHook | None = None
) -> None:
    """Wait until LiteLLM has reported the end of every call (callbacks run after the
    answer is returned)."""

    def ended() -> bool:
        routes = strategy.open_routes if strategy is not None else 0
        return routes == (hook.pending if hook is not None else 0) == 0

    await until(ended, "LiteLLM never reported a call's end")


async def until(condition: Callable[[], bool], failure: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, failure
        await asyncio.sleep(0.02)


def served(fleet: list[OpenAICompatibleServer]) -> list[int]:
    return [len(server.requests) for server in fleet]


@pytest.mark.parametrize("policy", ["combined", "gorgo"])
def test_later_turns_go_to_the_replica_holding_the_conversations_prefix(
    run: Run, policy: str
) -> None:
    conversations = ("alpha", "beta", "gamma")
    # "at once" exactly, however loaded the machine: every first turn is routed while
    # the others are in flight (the engines answer none before all have arrived), at
    # one instant of the strategy's clock (combined drains a replica's queue with time)
    together = Together(len(conversations))
    with ExitStack() as stack:
        fleet = [
            stack.enter_context(OpenAICompatibleServer(model=MODEL, reply=together.reply(name)))
            for name in NAMES
        ]
        routed = routing(fleet, policy, clock=FakeClock())
        _, router, strategy, hook = stack.enter_context(routed)

        async def scenario() -> tuple[list[str], list[str]]:
            # first turns at once: the load spreads them over the three replicas
            first = [
                hook.apply(question(c, 1, DOCUMENTS[3 * i : 3 * i + 3]))
                for i, c in enumerate(conversations)
            ]
            answers = await asyncio.gather(*(ask(router, d, stream=False) for d in first))
            await settled(strategy, hook)
            later = []  # then one at a time on an idle fleet, streamed or not
            for i, c in enumerate(conversations):
                data = hook.apply(question(c, 2, DOCUMENTS[3 * i + 1 : 3 * i + 4]))
                later.append(await ask(router, data, stream=i % 2 == 0))
                await settled(strategy, hook)
            return list(answers), later

        first, later = run(scenario())
    assert sorted(first) == sorted(reply_of(name) for name in NAMES)  # spread by load
    assert later == first  # each conversation back on its own replica, not fleet order
    for server in fleet:
        second_turn = server.requests[-1]["messages"]
        assert [m["role"] for m in second_turn] == ["system", "user", "assistant", "user"]
        assert server.cache.cached_tokens_total > 0  # the second turn reused the first's
    assert strategy.open_routes == 0


def chat(system: str, text: str) -> dict[str, Any]:
    """A plain request (no documents field): a long system prompt and a question."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    return {"model": MODEL, "messages": messages}


def test_a_cached_prefix_reported_by_the_engine_is_where_the_next_request_goes(
    run: Run, routed: Routed
) -> None:
    fleet, router, strategy, hook = routed
    shared = "\n\n".join(d["text"] for d in DOCUMENTS[:4])
    other = "\n\n".join(d["text"] for d in DOCUMENTS[4:8])

    async def scenario() -> list[str]:
        # two long prefixes at once: they land on different replicas
        loads = [chat(text, "First?") for text in (other, shared)]
        first = await asyncio.gather(*(ask(router, d, stream=True) for d in loads))
        await settled(strategy, hook)
        return [*first, await ask(router, chat(shared, "Next?"), stream=False)]

    other_answer, shared_answer, repeat_answer = run(scenario())
    assert other_answer != shared_answer
    assert repeat_answer == shared_answer
    holder = next(s for s in fleet if reply_of(NAMES[fleet.index(s)]) == shared_answer)
    assert holder.cache.cached_tokens_total > 0  # the engine served the prefix from cache


def test_the_hook_rewrites_requests_with_documents_and_records_their_answers(
    run: Run, routed: Routed
) -> None:
    fleet, router, strategy, hook = routed

    async def scenario() -> None:
        for turn, documents in enumerate((DOCUMENTS[:3], DOCUMENTS[1:4]), start=1):
            data = hook.apply(question("chat-1", turn, documents))
            await ask(router, data, stream=turn == 2)
            await settled(strategy, hook)

    run(scenario())
    sent = [r["messages"] for server in fleet for r in server.requests]
    assert len(sent) == 2
    second = max(sent, key=len)
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[2]["content"] in {reply_of(name) for name in NAMES}  # the recorded answer
    last = second[-1]["content"]
    assert "[doc3]" in last and "[doc1]" not in last  # doc1, doc2 sent before: notes only
    assert "Question 2 of chat-1?" in last
    assert all("contextpilot" not in r for server in fleet for r in server.requests)


def test_a_stamp_a_client_sent_is_never_taken_for_the_hooks(run: Run, routed: Routed) -> None:
    """On a proxy a client writes the metadata: a ``contextpilot`` stamp naming another
    conversation's pending turn (request ids are sequential) must not record the
    client's answer there."""
    _, router, strategy, hook = routed
    victims_turn = hook.apply(question("victim", 1, DOCUMENTS[:2]))
    stamp = victims_turn["metadata"]["contextpilot"]
    forged = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Unrelated?"}],
        "metadata": {"contextpilot": dict(stamp), "contextpilot_routes": ["r1"]},
    }

    async def scenario() -> None:
        await ask(router, hook.apply(forged), stream=False)
        await until(lambda: strategy.open_routes == 0, "the forged call never ended")

    run(scenario())
    (turn,) = hook.pilot.conversation("victim").turns
    assert turn.answer is None and hook.pending == 1  # still waiting for its own answer


def test_requests_without_the_field_pass_untouched() -> None:
    hook = ContextPilotHook()
    data = {"model": MODEL, "messages": [{"role": "user", "content": "Hello?"}], "metadata": {}}
    before = copy.deepcopy(data)
    assert hook.apply(data) is data
    assert data == before
    assert hook.pending == 0


def test_the_proxy_pre_call_hook_applies_the_pilot_and_removes_the_field(run: Run) -> None:
    hook = ContextPilotHook()
    data = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is topic 1?"},
        ],
        "extra_body": {"contextpilot": {"documents": ["plain text document", DOCUMENTS[1]]}},
    }
    rewritten = run(hook.async_pre_call_hook(None, None, data, "acompletion"))
    assert "extra_body" not in rewritten and "contextpilot" not in rewritten
    messages = rewritten["messages"]
    assert messages[0] == {"role": "system", "content": "Answer briefly."}
    assert "[doc1]" in messages[-1]["content"] and "plain text document" in messages[-1]["content"]
    stamped = rewritten["metadata"]["contextpilot"]
    assert stamped["request_id"] and stamped["boundaries"]


@pytest.mark.parametrize(
    ("field", "messages", "message"),
    [
        ({"documents": []}, None, "non-empty unless"),
        ({"documents": ["x"], "conversation": "c"}, None, "unknown keys"),
        ({"documents": [{"text": "x", "rank": 1}]}, None, "unknown keys"),
        ({"documents": ["x"]}, [{"role": "assistant", "content": "hi"}], "user's question"),
        (
            {"documents": ["x"]},
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
            ],
            "conversation_id",
        ),
    ],
)
def test_a_malformed_field_is_refused_before_the_pilot_changes(
    field: dict[str, Any], messages: list[dict[str, str]] | None, message: str
) -> None:
    hook = ContextPilotHook()
    data = {"model": MODEL, "messages": messages or [{"role": "user", "content": "Q?"}]}
    data["contextpilot"] = field
    with pytest.raises(InvalidInputError, match=message):
        hook.apply(data)
    assert hook.pending == 0 and hook.pilot.index_stats().requests == 0


def test_tenants_share_neither_history_nor_routes_and_carry_their_salt() -> None:
    hook = ContextPilotHook(send_cache_salt=True)
    asked = []
    for tenant in ("acme", "globex", "acme"):
        data = question("same-id", 1, DOCUMENTS[:2])
        data["contextpilot"]["tenant"] = tenant
        asked.append(hook.apply(data))
    acme, globex, acme_again = asked
    assert acme["messages"] == globex["messages"]  # no dedup against the other tenant
    assert acme_again["messages"] != acme["messages"]  # but against its own turn
    salts = [data["extra_body"]["cache_salt"] for data in asked]
    assert salts[0] == salts[2] != salts[1]
    keys = RouteKeys()
    text = keys.text(acme["messages"], None)
    hashes = [
        set(
            keys.request(
                text,
                request_id="r",
                expected_output_tokens=8,
                session=None,
                tenant=tenant,
                arrival_s=0.0,
            ).block_hashes
        )
        for tenant in ("acme", "globex", None)
    ]
    assert not hashes[0] & hashes[1] and not hashes[0] & hashes[2]


def test_a_tenant_follows_no_route_of_another_but_public_prompts_share_theirs(
    run: Run, fleet: list[OpenAICompatibleServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    public = [{**document, "shared": True} for document in DOCUMENTS[:3]]
    with routing(fleet, "combined", ContextPilotHook(send_cache_salt=True)) as routed:
        _, router, strategy, hook = routed
        decisions: list[Decision] = []
        choose = strategy.policy.choose

        def spy(request: RouteRequest, view: Any) -> Decision:
            decisions.append(choose(request, view))
            return decisions[-1]

        monkeypatch.setattr(strategy.policy, "choose", spy)

        async def scenario() -> list[dict[str, Any]]:
            sent = []
            for tenant, documents in [
                ("acme", DOCUMENTS[:3]),
                ("globex", DOCUMENTS[:3]),  # the same texts, another tenant
                ("acme", public),
                ("globex", public),
            ]:
                data = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "What do they say?"}],
                    "contextpilot": {"documents": documents, "tenant": tenant},
                }
                sent.append(hook.apply(data))
                await ask(router, data, stream=False)
                await settled(strategy, hook)
            return sent

        sent = run(scenario())
    salted = ["cache_salt" in data.get("extra_body", {}) for data in sent]
    assert salted == [True, True, False, False]
    assert decisions[1].predicted_cached_tokens == 0  # acme's route is not globex's
    assert decisions[3].predicted_cached_tokens > 0  # the public prompt's route is
    assert decisions[3].replica_id == decisions[2].replica_id


def test_one_quick_answer_does_not_make_a_deployment_look_several_times_faster() -> None:
    deployments = [
        {"model_name": MODEL, "litellm_params": {"model": MODEL}, "model_info": {"id": name}}
        for name in NAMES
    ]
    keys = RouteKeys()
    request = keys.request(
        keys.text([{"role": "user", "content": "x" * 4000}], None),
        request_id="r",
        expected_output_tokens=8,
        session=None,
        tenant=None,
        arrival_s=0.0,
    )

    def rates(prior_samples: float, answers: int) -> list[float]:
        """Prefill rates after ``answers`` answers of 1,000 uncached tokens per
        deployment, in 10 ms on ``a`` and 100 ms on the others."""
        fleet = Fleet(FleetConfig(rate_prior_samples=prior_samples))
        fleet.states(deployments, 0.0)
        for _ in range(answers):
            for name, ttft_s in zip(NAMES, (0.01, 0.1, 0.1), strict=True):
                route = fleet.open(request, Decision(name, MODEL, "test"), 0.0, 4000)
                fleet.close([route.route_id], name)
                fleet.answered(route, 1000, ttft_s, 0, ttft_s)
        return [state.prefill_tokens_per_s for state in fleet.states(deployments, 0.0)]

    once = rates(4.0, 1)
    assert 1 < once[0] / once[1] < 2  # one answer moves a only part of the way ...
    assert rates(0.0, 1)[0] / rates(0.0, 1)[1] == pytest.approx(10)  # (its own alone)
    consistent = rates(4.0, 20)
    assert consistent[0] / consistent[1] > 4  # ... answers that agree earn it its own
    with pytest.raises(ConfigError, match="rate_prior_samples"):
        FleetConfig(rate_prior_samples=-1)


def test_strategies_on_one_store_route_as_one(
    run: Run, fleet: list[OpenAICompatibleServer]
) -> None:
    store = MemoryRouteStore()
    first = ContextPilotRoutingStrategy("combined", store=store).attach(router_over(fleet))
    # another process: its own router, the deployments listed the other way round
    second_router = router_over(fleet[::-1])
    second = ContextPilotRoutingStrategy("combined", store=store).attach(second_router)
    shared = "\n\n".join(d["text"] for d in DOCUMENTS[:4])
    other = "\n\n".join(d["text"] for d in DOCUMENTS[4:8])

    async def scenario() -> tuple[list[str], str]:
        loads = [chat(text, "First?") for text in (other, shared)]
        answers = await asyncio.gather(*(ask(first.router, d, stream=False) for d in loads))
        await settled(first)
        assert first.shared is not None and first.shared.flush()
        return list(answers), await ask(second_router, chat(shared, "Next?"), stream=True)

    try:
        (_, holder), repeat = run(scenario())
    finally:
        first.close()
        second.close()
    assert repeat == holder != reply_of(NAMES[-1])  # not the second router's first choice


def test_a_failed_deployment_is_released_and_avoided(
    run: Run,
    fleet: list[OpenAICompatibleServer],
) -> None:
    dead = OpenAICompatibleServer(model=MODEL).start()
    dead_url = dead.base_url
    dead.stop()
    router = Router(
        model_list=[
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": f"openai/{MODEL}",
                    "api_base": url,
                    "api_key": "loopback",
                },
            }
            for url in (dead_url, fleet[0].base_url)
        ],
        num_retries=0,
    )
    strategy = ContextPilotRoutingStrategy(
        "combined", fleet=FleetConfig(backoff_s=60.0, max_backoff_s=60.0)
    )
    strategy.attach(router)
    data = {"model": MODEL, "messages": [{"role": "user", "content": "Hello?"}]}

    async def scenario() -> list[str]:
        answers = []
        for _ in range(2):
            try:
                answers.append(await ask(router, dict(data), stream=False))
            except Exception as exc:  # the dead deployment, first in fleet order
                answers.append(type(exc).__name__)
            await settled(strategy)
        return answers

    try:
        first, second = run(scenario())
    finally:
        strategy.detach()
    assert first != reply_of("a")  # the dead one failed ...
    assert second == reply_of("a")  # ... and its breaker sent the next call elsewhere
    assert strategy.open_routes == 0


def test_the_sync_router_path_routes_and_learns(
    fleet: list[OpenAICompatibleServer],
) -> None:
    router = router_over(fleet)
    strategy = ContextPilotRoutingStrategy("ranvier").attach(router)
    try:
        response = router.completion(
            model=MODEL, messages=[{"role": "user", "content": "Hello " * 100}]
        )
        assert response.choices[0].message.content in {reply_of(name) for name in NAMES}
        deadline = time.monotonic() + 10
        while strategy.open_routes:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        strategy.detach()
    assert sum(served(fleet)) == 1


def test_on_the_proxy_the_strategy_attaches_itself_before_the_first_routing(
    run: Run,
    fleet: list[OpenAICompatibleServer],
) -> None:
    router = router_over(fleet)
    strategy = ContextPilotRoutingStrategy("combined", router_source=lambda: router)
    try:
        data = {"model": MODEL, "messages": [{"role": "user", "content": "Hi?"}]}
        run(strategy.async_pre_call_hook(None, None, data, "acompletion"))
        assert strategy.router is router and strategy in litellm.callbacks
        run(router.acompletion(**data))
        assert sum(served(fleet)) == 1
    finally:
        strategy.detach()


def registry_only(names: Sequence[str]) -> SimpleNamespace:
    """A stand-in for the parts of a ``Router`` the sync path reads: its registry of
    deployments ``names`` (nothing is sent through it)."""
    deployments = [
        {
            "model_name": MODEL,
            "litellm_params": {"model": f"openai/{MODEL}"},
            "model_info": {"id": n},
        }
        for n in names
    ]
    return SimpleNamespace(
        register_plugin=lambda plugin: None,
        registry=lambda: SimpleNamespace(deployments=lambda model: deployments),
    )


def test_a_call_whose_end_is_never_reported_is_released_after_the_route_ttl() -> None:
    router = registry_only(NAMES)
    clock = FakeClock()
    strategy = ContextPilotRoutingStrategy(
        "combined", fleet=FleetConfig(route_ttl_s=60.0), clock=clock
    ).attach(router)
    try:
        request = {"messages": [{"role": "user", "content": "Hello " * 200}]}
        strategy.get_available_deployment(MODEL, request["messages"], request_kwargs=request)
        assert strategy.open_routes == 1
        clock.now += 61.0
        strategy.get_available_deployment(MODEL, request["messages"], request_kwargs={})
        assert strategy.open_routes == 1  # the first released, the second open
        assert len(request["metadata"]["contextpilot_routes"]) == 1
    finally:
        strategy.detach()


def test_one_strategys_call_never_closes_another_strategys_route() -> None:
    """LiteLLM's callbacks are process-wide: every strategy in a process is told of
    every call's end, so the first route of each must not share an id."""
    router = registry_only(NAMES[:1])  # one deployment: both strategies route to it
    first = ContextPilotRoutingStrategy("combined").attach(router)
    second = ContextPilotRoutingStrategy("combined").attach(router)
    try:
        requests = [{"messages": [{"role": "user", "content": "Hello " * 200}]} for _ in "ab"]
        for strategy, request in zip((first, second), requests, strict=True):
            strategy.get_available_deployment(MODEL, request["messages"], request_kwargs=request)
        ids = [request["metadata"]["contextpilot_routes"] for request in requests]
        assert ids[0] != ids[1]
        ended = {"litellm_params": {"metadata": requests[0]["metadata"], "model_info": {"id": "a"}}}
        second.log_success_event(ended, None, None, None)  # the first's call, as LiteLLM does
        assert second.open_routes == 1 and first.open_routes == 1
        first.log_success_event(ended, None, None, None)
        assert first.open_routes == 0 and second.open_routes == 1
    finally:
        first.detach()
        second.detach()


def test_a_call_id_two_requests_share_releases_neither_on_one_failure() -> None:
    """On the proxy a client may choose ``litellm_call_id`` (``x-litellm-call-id``):
    one request's failure must not release another in-flight request's route."""
    router = registry_only(NAMES)
    strategy = ContextPilotRoutingStrategy("combined").attach(router)
    try:
        requests = [as_the_proxy_sends(chat(f"System {n}. " * 40, "Hi?")) for n in range(3)]
        requests[1]["litellm_call_id"] = requests[0]["litellm_call_id"]  # the client's choice
        for request in [*requests, requests[0]]:  # the last, the first one's retry
            messages = request["messages"]
            strategy.get_available_deployment(MODEL, messages, request_kwargs=request)
        # the retry closed the first attempt's route and kept the id shared
        assert strategy.open_routes == 3
        strategy.request_failed(requests[1], RuntimeError("refused by a guardrail"))
        assert strategy.open_routes == 3  # neither request is known to be the one that failed
        strategy.request_failed(requests[2], RuntimeError("refused by a guardrail"))
        assert strategy.open_routes == 2  # an id no other request has still closes
    finally:
        strategy.detach()


def test_a_policy_is_chosen_by_its_registry_name_with_its_options() -> None:
    strategy = ContextPilotRoutingStrategy("combined", policy_options={"hold_wait_s": None})
    assert strategy.policy.name == "combined"
    with pytest.raises(ConfigError, match="unknown routing policy"):
        ContextPilotRoutingStrategy("fastest")
    with pytest.raises(ConfigError, match="by name only"):
        ContextPilotRoutingStrategy(strategy.policy, policy_options={"hold_wait_s": None})


# -- one call's state stays its own: shared metadata, cancellation, failures -----------------


class LoggedRoutes(CustomLogger):
    """The route ids LiteLLM logs on each successful call's metadata."""

    def __init__(self) -> None:
        super().__init__()
        self.routes: list[list[str]] = []

    async def async_log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self.routes.append(list(kwargs["litellm_params"]["metadata"]["contextpilot_routes"]))


def test_one_metadata_dict_shared_by_concurrent_calls_keeps_each_answer_its_own(
    run: Run,
) -> None:
    def answer(messages: list[dict[str, Any]]) -> str:
        return "answer to " + messages[-1]["content"].split()[-1]  # "... of alice?"

    tags: dict[str, Any] = {"app": "rag"}  # one dict an application sends with every call
    hook = ContextPilotHook().attach()
    with OpenAICompatibleServer(model=MODEL, reply=answer) as server:
        router = router_over([server])

        async def scenario() -> None:
            asked = [
                hook.apply({**question(name, 1, DOCUMENTS[:2]), "metadata": tags})
                for name in ("alice", "bob")
            ]
            await asyncio.gather(*(router.acompletion(**data) for data in asked))
            await settled(None, hook)

        try:
            run(scenario())
        finally:
            hook.detach()
    for name in ("alice", "bob"):
        turns = hook.pilot.conversation(name).turns
        assert [turn.answer for turn in turns] == [f"answer to {name}?"]
    assert "contextpilot" not in tags


def test_calls_sharing_one_metadata_dict_each_report_their_own_route(
    run: Run, fleet: list[OpenAICompatibleServer]
) -> None:
    tags: dict[str, Any] = {"contextpilot_routes": ["r1"]}  # a list the strategy did not make
    logged = LoggedRoutes()
    with routing(fleet, "combined") as (_, router, strategy, _hook):
        add_callback(logged)

        async def scenario() -> None:
            calls = [
                router.acompletion(**chat(f"System prompt {n}. " * 40, "Hi?"), metadata=tags)
                for n in range(6)
            ]
            await asyncio.gather(*calls)
            await settled(strategy)
            await until(lambda: len(logged.routes) == 6, "a success was not logged")

        try:
            run(scenario())
        finally:
            remove_callback(logged)
    assert [len(routes) for routes in logged.routes] == [1] * 6  # its own decision only
    assert len({routes[0] for routes in logged.routes}) == 6
    assert tags["contextpilot_routes"] == ["r1"]  # the caller's list, untouched


@pytest.mark.parametrize("given_up", ["call", "stream"])
def test_a_call_cancelled_with_its_task_releases_its_deployment_at_once(
    run: Run, given_up: str
) -> None:
    arrived, answer = threading.Event(), threading.Event()

    def held(_messages: list[dict[str, Any]]) -> str:
        arrived.set()
        answer.wait(10)  # the engine holds the answer: the call is cancelled in flight
        return "too late"

    words = "word " * 100  # 5 s at 50 ms a word: read from, then cancelled mid-stream
    engine = (
        OpenAICompatibleServer(model=MODEL, reply=held)
        if given_up == "call"
        else OpenAICompatibleServer(model=MODEL, reply=lambda _m: words, token_delay_s=0.05)
    )
    with engine:
        router = router_over([engine])
        strategy = ContextPilotRoutingStrategy("combined").attach(router)
        data = {"model": MODEL, "messages": [{"role": "user", "content": "Hello?"}]}

        async def call() -> None:
            if given_up == "call":
                await router.acompletion(**data)
                return
            async for _chunk in await router.acompletion(**data, stream=True):
                arrived.set()  # as a proxy's client that goes away mid-answer

        async def scenario() -> None:
            task = asyncio.create_task(call())
            await until(arrived.is_set, "the call never reached the engine")
            assert strategy.open_routes == 1 and not task.done()
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
            await until(lambda: strategy.open_routes == 0, "still counted busy", timeout_s=2)

        try:
            run(scenario())
        finally:
            answer.set()
            strategy.detach()
    assert strategy.open_routes == 0  # not after FleetConfig.route_ttl_s (600 s)


def test_a_call_that_fails_for_good_is_evicted_when_its_task_ends(run: Run) -> None:
    router = router_falling_back(dead_url(), dead_url())  # two attempts, both fail
    hook = ContextPilotHook().attach()

    async def handle() -> str:  # one request's task, as a web handler's
        data = hook.apply(question("chat-9", 1, DOCUMENTS[:2]))
        assert hook.pending == 1 and hook.pilot.index_stats().requests == 1
        try:
            await router.acompletion(**data)
        except Exception as exc:
            return type(exc).__name__
        return "answered"

    async def scenario() -> str:
        outcome = await asyncio.create_task(handle())
        await settled(None, hook)
        return outcome

    try:
        outcome = run(scenario())
    finally:
        hook.detach()
    assert outcome != "answered"
    assert hook.pilot.index_stats().requests == 0  # no engine cached the prompt
    turns = hook.pilot.conversation("chat-9").turns
    assert len(turns) == 1 and turns[0].answer is None  # the question stays, unanswered


def test_a_failed_call_is_final_when_its_caller_applies_the_hook_again(run: Run) -> None:
    router = router_falling_back(dead_url(), dead_url())
    hook = ContextPilotHook().attach()

    async def scenario() -> None:  # one task, one call after the other
        failed = hook.apply(question("chat-8", 1, DOCUMENTS[:2]))
        with suppress(Exception):
            await router.acompletion(**failed)
        hook.apply(question("chat-8", 2, DOCUMENTS[2:4]))

    try:
        run(scenario())
    finally:
        hook.detach()
    assert hook.pending == 1  # the second prompt only
    assert hook.pilot.index_stats().requests == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_fallback_that_answers_keeps_the_failed_attempts_prompt(
    run: Run, fleet: list[OpenAICompatibleServer], stream: bool
) -> None:
    router = router_falling_back(dead_url(), fleet[0].base_url)
    hook = ContextPilotHook().attach()

    async def scenario() -> str:
        data = hook.apply(question("chat-7", 1, DOCUMENTS[:2]))
        answer = await asyncio.create_task(ask(router, data, stream=stream))
        await settled(None, hook)  # the call's task has ended: the answer still counts
        return answer

    try:
        answer = run(scenario())
    finally:
        hook.detach()
    assert answer == reply_of("a")
    assert [turn.answer for turn in hook.pilot.conversation("chat-7").turns] == [answer]
    assert hook.pilot.index_stats().requests == 1


# -- what LiteLLM does not report: a proxy request's retries, a provider's own metadata ---------


def as_the_proxy_sends(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as the LiteLLM proxy hands it to its router: with a call id and one
    logging object for the whole request (``litellm_logging_obj``), which runs the
    failure callbacks for the first failed attempt only."""
    data = {**data, "litellm_call_id": str(uuid.uuid4())}
    now = datetime.datetime.now()
    logging_obj, data = litellm.utils.function_setup(
        "acompletion", litellm.utils.Rules(), now, **data
    )
    data["litellm_logging_obj"] = logging_obj
    return data


async def fail_as_the_proxy_does(
    router: Router, data: dict[str, Any], hooks: list[CustomLogger]
) -> None:
    """Send ``data`` (it must fail), then tell ``hooks`` as the proxy tells its
    callbacks of a failed request (its logging object taken off first)."""
    with pytest.raises(litellm.exceptions.InternalServerError) as failed:
        await router.acompletion(**data)
    data.pop("litellm_logging_obj")
    for hook in hooks:
        await hook.async_post_call_failure_hook(
            request_data=data, original_exception=failed.value, user_api_key_dict=None
        )


def retrying_over_dead_deployments() -> Router:
    """Two dead deployments, each call tried three times (two retries)."""
    model_list = [deployment(dead_url()), deployment(dead_url())]
    return Router(model_list=model_list, num_retries=2, retry_after=0)


class Retrying(NamedTuple):
    """A strategy over dead deployments, the failures its policy is told of (not
    give-ups), and a request as the proxy sends it."""

    strategy: ContextPilotRoutingStrategy
    failures: list[Outcome]
    data: dict[str, Any]


@pytest.fixture
def retrying(monkeypatch: pytest.MonkeyPatch) -> Iterator[Retrying]:
    strategy = ContextPilotRoutingStrategy("combined").attach(retrying_over_dead_deployments())
    failures: list[Outcome] = []
    observe = strategy.policy.observe

    def spy(outcome: Outcome) -> None:
        if outcome.error is not None and not outcome.cancelled:
            failures.append(outcome)
        observe(outcome)

    monkeypatch.setattr(strategy.policy, "observe", spy)
    try:
        yield Retrying(strategy, failures, as_the_proxy_sends(chat("System prompt. " * 40, "Hi?")))
    finally:
        strategy.detach()


def test_a_retry_closes_the_failed_attempt_whose_failure_litellm_did_not_report(
    run: Run, retrying: Retrying
) -> None:
    if _litellm_version() < (1, 110):
        pytest.skip(
            f"litellm {_litellm_version()} copies no earlier route ids into a retry's "
            "metadata (1.110 does): there the proxy's failure report closes them (next test)"
        )
    strategy, failures, data = retrying

    async def scenario() -> None:
        with pytest.raises(litellm.exceptions.InternalServerError):
            await strategy.router.acompletion(**data)
        # the first attempt's failure is reported, the second's known from the third's routing
        await until(lambda: strategy.open_routes == 1, "a retried attempt's route stayed open")

    run(scenario())
    assert len(failures) == 2  # each counted against its deployment


def _litellm_version() -> tuple[int, ...]:
    release = importlib.metadata.version("litellm").split(".")[:2]
    return tuple(int(part) for part in release if part.isdigit())


def test_the_proxys_failure_hook_closes_the_last_attempts_route(
    run: Run, retrying: Retrying
) -> None:
    strategy, failures, data = retrying

    async def scenario() -> None:
        await fail_as_the_proxy_does(strategy.router, data, [strategy])
        await until(lambda: strategy.open_routes == 0, "the last attempt's route stayed open")

    run(scenario())
    assert len(failures) == 3  # not released after FleetConfig.route_ttl_s (600 s)


def test_a_proxy_request_whose_retries_all_failed_is_evicted(run: Run) -> None:
    router = retrying_over_dead_deployments()
    hook = ContextPilotHook().attach()

    async def handle() -> None:  # the proxy's handler of one request
        data = as_the_proxy_sends(question("chat-6", 1, DOCUMENTS[:2]))
        data = await hook.async_pre_call_hook(None, None, data, "acompletion")
        await fail_as_the_proxy_does(router, data, [hook])

    try:
        run(handle())
        run(settled(None, hook))
    finally:
        hook.detach()
    assert hook.pilot.index_stats().requests == 0  # no engine cached the prompt
    (turn,) = hook.pilot.conversation("chat-6").turns
    assert turn.answer is None  # the question stays, unanswered


@pytest.mark.parametrize("endpoint", ["anthropic_messages", "responses"])
def test_a_call_with_the_providers_own_metadata_reports_its_route(run: Run, endpoint: str) -> None:
    """On /v1/messages and /v1/responses ``metadata`` is the provider's field (Claude
    Code always sends ``metadata.user_id``); LiteLLM's own is ``litellm_metadata``."""
    with CloudCacheServer() as server:
        api_base, model = (
            (server.anthropic_base_url, "anthropic/claude-test")
            if endpoint == "anthropic_messages"
            else (server.openai_base_url, "openai/gpt-test")
        )
        params = {"model": model, "api_base": api_base, "api_key": "loopback"}
        router = Router(model_list=[{"model_name": MODEL, "litellm_params": params}])
        strategy = ContextPilotRoutingStrategy("combined").attach(router)

        async def scenario() -> object:
            if endpoint == "anthropic_messages":
                answer = await router.aanthropic_messages(
                    model=MODEL,
                    messages=[{"role": "user", "content": "Hello?"}],
                    max_tokens=16,
                    metadata={"user_id": "u"},
                )
            else:
                answer = await router.aresponses(model=MODEL, input="Hello?", metadata={"k": "v"})
            await until(lambda: strategy.open_routes == 0, "the call's route stayed open")
            return answer

        try:
            answer = run(scenario())
        finally:
            strategy.detach()
        (sent,) = server.requests
    assert answer is not None
    assert "contextpilot_routes" not in sent.body.get("metadata", {})  # LiteLLM's, not sent
