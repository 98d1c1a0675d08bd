"""The system-fold benchmark's bookkeeping (its engine runs need llama-server)."""

from __future__ import annotations

import system_fold as bench

from contextpilot_rag import ContextBlock
from contextpilot_rag.bench.engine_workloads import EngineRequest


def request(session: str, question: str) -> EngineRequest:
    return EngineRequest(session, (ContextBlock("text", id="d"),), question, "answer")


def test_each_conversation_is_sent_in_a_row_in_first_seen_order() -> None:
    round_robin = [request(s, f"{s}{t}") for t in range(3) for s in "ba"]
    order = [r.question for r in bench.by_conversation(round_robin)]
    assert order == ["b0", "b1", "b2", "a0", "a1", "a2"]


def test_shares_and_ratios_are_per_turn_and_against_the_system_message_arm() -> None:
    plain = bench.ArmResult("t", "system message", [1, 2, 1, 2], [100, 200, 100, 300])
    plain.computed, plain.prefill_ms = [100, 200, 100, 300], [10.0, 20.0, 10.0, 30.0]
    folded = bench.ArmResult("t", "folded", [1, 2, 1, 2], [100, 200, 100, 300])
    folded.computed, folded.prefill_ms = [100, 50, 100, 50], [10.0, 5.0, 10.0, 5.0]
    assert folded.computed_share(1) == 1.0 and folded.computed_share(2) == 0.2
    assert folded.later(folded.computed) == 100
    table = bench.markdown([plain, folded], "facts")
    row = next(line for line in table.splitlines() if line.startswith("| t | folded"))
    # 300 of 700 computed; 100 of 500 on turns 2+; 300 / 700 of the plain arm's
    assert "| 42.9% | 20.0% | 0.43x |" in row and row.endswith("| 0.43x |")
