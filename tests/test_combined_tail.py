"""The combined policy's E2E tail weighting (``tail_quantile``): requests with long
expected answers count in full, the others' decode time at ``tail_discount``."""

from __future__ import annotations

import pytest

from contextpilot_rag.errors import ConfigError
from contextpilot_rag.routing import CombinedPolicy
from contextpilot_rag.routing.types import Outcome, RouteRequest
from contextpilot_rag.sim import Replica
from contextpilot_rag.sim.fleet import SimFleetView

FLEET = (Replica("a"), Replica("b"))
MODEL = FLEET[0].model


def _view(now: float, in_flight: dict[str, int]) -> SimFleetView:
    return SimFleetView(now, tuple(r.state(in_flight.get(r.replica_id, 0), 0) for r in FLEET))


def _request(name: str, output_tokens: int, *, only: str | None = None) -> RouteRequest:
    others = frozenset((r.replica_id, MODEL) for r in FLEET if only and r.replica_id != only)
    return RouteRequest(
        name, prompt_tokens=8_000, expected_output_tokens=output_tokens, excluded=others
    )


def _placement(policy: CombinedPolicy) -> str:
    """Where a short request goes when one long answer decodes on ``a`` and three short
    ones on ``b`` (both replicas otherwise alike, nothing cached)."""
    for number in range(50):  # finished requests: outputs 1..50 set the tail threshold
        request = _request(f"warm-{number}", number + 1)
        decision = policy.choose(request, _view(0.0, {}))
        policy.observe(Outcome(request, decision, 0.1, 1.0))
    policy.choose(_request("long", 2_000, only="a"), _view(1.0, {}))
    for number in range(3):
        policy.choose(_request(f"short-{number}", 20, only="b"), _view(1.0, {"a": 1}))
    return policy.choose(_request("probe", 20), _view(1.5, {"a": 1, "b": 3})).replica_id


def test_short_answers_go_where_they_delay_no_long_one() -> None:
    # the mean cost delays one decoder on a rather than three on b; weighted toward the
    # tail, delaying the long answer costs more than delaying three short ones
    assert _placement(CombinedPolicy(hold_wait_s=None)) == "a"
    assert _placement(CombinedPolicy(hold_wait_s=None, tail_quantile=0.8)) == "b"


def test_with_no_discount_the_weighting_is_the_mean_cost() -> None:
    plain = CombinedPolicy(hold_wait_s=None)
    undiscounted = CombinedPolicy(hold_wait_s=None, tail_quantile=0.8, tail_discount=1.0)
    assert _placement(undiscounted) == _placement(plain)


@pytest.mark.parametrize(
    "options",
    [
        {"tail_quantile": 0.0},
        {"tail_quantile": 1.0},
        {"tail_discount": -0.1},
        {"duty_tau_s": float("nan")},  # NaN passes every range check: every cost NaN
        {"tail_discount": float("nan")},
    ],
)
def test_bad_tail_settings_are_refused(options: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        CombinedPolicy(**options)  # type: ignore[arg-type]
