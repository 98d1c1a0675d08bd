"""`contextpilot-rag optimize`: JSON Lines in, prompts out; bad lines numbered, good ones kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contextpilot_rag import ContextBlock, ContextPilot
from contextpilot_rag.cli import main
from contextpilot_rag.request_field import parse_pilot_fields


def _write(path: Path, *items: object) -> Path:
    path.write_text("\n".join(i if isinstance(i, str) else json.dumps(i) for i in items) + "\n")
    return path


def _run(
    tmp_path: Path, *items: object, flags: tuple[str, ...] = ()
) -> tuple[int, list[dict[str, Any]]]:
    source = _write(tmp_path / "in.jsonl", *items)
    sink = tmp_path / "out.jsonl"
    code = main(["optimize", "-i", str(source), "-o", str(sink), *flags])
    return code, [json.loads(line) for line in sink.read_text().splitlines()]


def _blocks(turn: dict[str, Any]) -> tuple[ContextBlock, ...]:
    return parse_pilot_fields({"documents": turn["documents"]}).documents


TURN_1 = {
    "question": "What is alpha?",
    "documents": [{"id": "a", "text": "Alpha is the first letter."}, "Beta comes second."],
    "conversation_id": "c1",
}
TURN_2 = {
    "question": "And beta?",
    "documents": ["Beta comes second.", {"id": "g", "text": "Gamma is third."}],
    "conversation_id": "c1",
}


def test_round_trip_matches_the_pilot_called_directly(tmp_path: Path) -> None:
    answer = {"conversation_id": "c1", "answer": "The first letter."}
    code, out = _run(tmp_path, TURN_1, answer, TURN_2)
    assert code == 0
    assert [r["line"] for r in out] == [1, 2, 3]
    assert out[1] == {"line": 2, "recorded": "c1"}

    pilot = ContextPilot()
    blocks_1 = _blocks(TURN_1)
    first = pilot.optimize(blocks_1, "What is alpha?", conversation_id="c1")
    pilot.record_answer(first, "The first letter.")
    blocks_2 = _blocks(TURN_2)
    second = pilot.optimize(blocks_2, "And beta?", conversation_id="c1")

    assert out[0]["messages"] == [dict(m) for m in first.messages]
    assert out[2]["messages"] == [dict(m) for m in second.messages]
    # the repeated document is de-duplicated against the first turn
    assert out[2]["deduplicated"] == [b.id for b in second.deduplicated] != []
    assert out[2]["conversation_id"] == "c1"


def test_bad_lines_are_numbered_and_the_good_ones_still_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _run(
        tmp_path,
        "not json",
        TURN_1,
        "",
        {"question": "x", "documents": []},
        {"question": "x", "documents": ["d"], "colour": "red"},
        [1, 2],
        {"question": "y", "documents": ["e"]},
    )
    assert code == 1
    assert [r["line"] for r in out] == [1, 2, 4, 5, 6, 7]  # the blank line 3 gives none
    errors = {r["line"]: r["error"] for r in out if "error" in r}
    assert sorted(errors) == [1, 4, 5, 6]
    assert "not valid JSON" in errors[1]["message"]
    assert "documents" in errors[4]["message"]
    assert "colour" in errors[5]["message"]
    assert "object" in errors[6]["message"]
    assert "messages" in out[1] and "messages" in out[5]
    stderr = capsys.readouterr().err
    assert "line 1: LineError" in stderr and "line 5:" in stderr


def test_stop_on_error_stops_at_the_first_bad_line(tmp_path: Path) -> None:
    code, out = _run(tmp_path, TURN_1, "{", TURN_2, flags=("--stop-on-error",))
    assert code == 1
    assert [r["line"] for r in out] == [1, 2]
    assert "error" in out[1]


def test_a_bad_answer_line_changes_nothing(tmp_path: Path) -> None:
    # an answer for a conversation that does not exist, then one with a wrong type
    code, out = _run(
        tmp_path,
        {"conversation_id": "nope", "answer": "x"},
        {"conversation_id": "c1", "answer": 3},
        TURN_1,
        {"conversation_id": "c1", "answer": "ok"},
    )
    assert code == 1
    assert out[0]["error"]["type"] == "UnknownConversationError"
    assert "'answer' must be a string" in out[1]["error"]["message"]
    assert out[3] == {"line": 4, "recorded": "c1"}


def test_tenant_requests_carry_their_cache_salt(tmp_path: Path) -> None:
    code, out = _run(tmp_path, {**TURN_1, "tenant": "acme"})
    assert code == 0
    assert out[0]["tenant"] == "acme" and isinstance(out[0]["cache_salt"], str)


def test_a_store_that_cannot_be_opened_is_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _write(tmp_path / "in.jsonl", TURN_1)
    assert main(["optimize", "-i", str(source), "--store", "ftp://nowhere"]) == 2
    assert "ftp" in capsys.readouterr().err
