"""`contextpilot-rag optimize`: JSON Lines in, prompts out; bad lines numbered, good ones kept."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from contextpilot_rag import ContextBlock, ContextPilot
from contextpilot_rag.cli import EXIT_BROKEN_PIPE, main
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


def _command(*flags: str, stdin: bytes | BinaryIO = b"") -> subprocess.CompletedProcess[bytes]:
    """The real command in a fresh interpreter; ``stdin``: its input, or a file it reads."""
    data = stdin if isinstance(stdin, bytes) else None
    return subprocess.run(
        [sys.executable, "-m", "contextpilot_rag.cli", "optimize", *flags],
        input=data,
        stdin=None if data is not None else stdin,
        capture_output=True,
        timeout=120,
        check=False,
    )


def _lines(output: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.decode("utf-8").splitlines()]


def test_a_line_the_json_parser_refuses_is_that_lines_error(tmp_path: Path) -> None:
    huge_number = '{"question": "q", "documents": ["a"], "x": ' + "1" * 5000 + "}"
    too_deep = "[" * 100_000 + "]" * 100_000
    code, out = _run(tmp_path, TURN_1, huge_number, too_deep, TURN_2)
    assert code == 1
    assert [r["line"] for r in out] == [1, 2, 3, 4]
    assert "digits" in out[1]["error"]["message"]
    assert "nested too deeply" in out[2]["error"]["message"]
    assert "messages" in out[0] and "messages" in out[3]


@pytest.mark.parametrize(
    ("where", "message"),
    [("input", "cannot read"), ("output folder", "cannot write"), ("output", "cannot write")],
)
def test_an_input_or_output_that_cannot_be_opened_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, message: str
) -> None:
    source, sink = _write(tmp_path / "in.jsonl", TURN_1), tmp_path / "out.jsonl"
    if where == "input":
        source = tmp_path / "missing.jsonl"
    elif where == "output folder":
        sink = tmp_path / "missing" / "out.jsonl"
    else:
        sink = tmp_path  # a directory
    assert main(["optimize", "-i", str(source), "-o", str(sink)]) == 2
    assert message in capsys.readouterr().err


def test_an_undecodable_byte_is_its_lines_error_from_a_file_as_from_stdin(tmp_path: Path) -> None:
    data = b'{"question": "q\xff", "documents": ["a"]}\n' + json.dumps(TURN_1).encode() + b"\n"
    source = tmp_path / "in.bin"
    source.write_bytes(data)
    from_file, from_stdin = _command("-i", str(source)), _command(stdin=data)
    assert from_file.returncode == from_stdin.returncode == 1
    assert b"Traceback" not in from_file.stderr
    assert _lines(from_file.stdout) == _lines(from_stdin.stdout)
    assert "error" in _lines(from_file.stdout)[0]
    assert "messages" in _lines(from_file.stdout)[1]


def test_a_bare_carriage_return_inside_a_line_is_whitespace_from_a_file_as_from_stdin(
    tmp_path: Path,
) -> None:
    data = b'{"question": "q",\r"documents": ["a"]}\r\n'
    source = tmp_path / "in.jsonl"
    source.write_bytes(data)
    code = main(["optimize", "-i", str(source), "-o", str(tmp_path / "out.jsonl")])
    assert code == 0
    assert [r["line"] for r in _lines((tmp_path / "out.jsonl").read_bytes())] == [1]
    assert _command(stdin=data).returncode == 0


def test_the_output_may_not_be_the_input(tmp_path: Path) -> None:
    source = _write(tmp_path / "in.jsonl", TURN_1)
    before = source.read_bytes()
    assert main(["optimize", "-i", str(source), "-o", str(source)]) == 2
    with source.open("rb") as stdin:
        same_via_stdin = _command("-o", str(source), stdin=stdin)
    assert same_via_stdin.returncode == 2
    assert b"is the input" in same_via_stdin.stderr
    assert source.read_bytes() == before


def test_a_store_that_does_not_answer_is_exit_2_and_its_password_is_not_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("redis")
    source = _write(tmp_path / "in.jsonl", {"question": "q", "documents": ["a"]})
    sink = tmp_path / "out.jsonl"
    store = "redis://user:s3cret@127.0.0.1:1/0?timeout_s=0.2"  # nothing listens on port 1
    assert main(["optimize", "-i", str(source), "-o", str(sink), "--store", store]) == 2
    err = capsys.readouterr().err
    assert "does not answer" in err and "***@127.0.0.1:1" in err and "s3cret" not in err
    assert not sink.exists()  # refused before the output was opened


def test_a_reader_that_goes_away_ends_the_run_quietly_with_141(tmp_path: Path) -> None:
    requests = [{"question": f"q{n}", "documents": [f"doc {n} " * 50]} for n in range(400)]
    source = _write(tmp_path / "in.jsonl", *requests)
    command = [sys.executable, "-m", "contextpilot_rag.cli", "optimize", "-i", str(source)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as running:
        assert running.stdout is not None and running.stderr is not None
        assert json.loads(running.stdout.readline())["line"] == 1
        running.stdout.close()  # as `| head -1` does
        err = running.stderr.read()
        code = running.wait(timeout=120)
    assert code == EXIT_BROKEN_PIPE == 141
    assert b"Traceback" not in err and b"BrokenPipe" not in err


def test_a_score_past_floats_range_is_its_lines_error_named_as_the_line_names_it(
    tmp_path: Path,
) -> None:
    huge = {"question": "q", "documents": [{"text": "a", "score": 10**400}]}
    code, out = _run(tmp_path, huge, TURN_1)
    assert code == 1 and [r["line"] for r in out] == [1, 2]
    message = out[0]["error"]["message"]
    assert message.startswith("'documents[0].score' must be") and "contextpilot." not in message
    assert "messages" in out[1]  # the next line still runs


def test_a_conversation_the_pilot_no_longer_holds_is_flagged_history_lost(tmp_path: Path) -> None:
    code, out = _run(tmp_path, TURN_1, TURN_2)
    assert code == 0 and [r["history_lost"] for r in out] == [False, False]
    assert (
        "history_lost"
        not in _run(tmp_path, {k: v for k, v in TURN_1.items() if k != "conversation_id"})[1][0]
    )


def test_a_byte_order_mark_before_the_first_line_is_no_text(tmp_path: Path) -> None:
    source = tmp_path / "bom.jsonl"
    source.write_bytes(b"\xef\xbb\xbf" + json.dumps(TURN_1).encode() + b"\n")
    sink = tmp_path / "out.jsonl"
    assert main(["optimize", "-i", str(source), "-o", str(sink)]) == 0
    assert "error" not in json.loads(sink.read_text(encoding="utf-8"))


def test_standard_output_is_utf8_json_lines_whatever_the_locale(tmp_path: Path) -> None:
    line = {"question": "巴黎在哪里?", "documents": ["巴黎是法国的首都。"]}
    source = _write(tmp_path / "in.jsonl", line, line)
    done = subprocess.run(
        [sys.executable, "-m", "contextpilot_rag", "optimize", "-i", str(source)],
        capture_output=True,
        env={**_environ(), "PYTHONIOENCODING": "cp1252"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = [json.loads(row) for row in done.stdout.decode("utf-8").splitlines()]
    assert len(results) == 2 and "巴黎" in results[0]["messages"][-1]["content"]


def test_an_output_that_cannot_be_written_is_a_usage_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    source = _write(tmp_path / "in.jsonl", TURN_1)
    assert main(["optimize", "-i", str(source), "-o", "/dev/full"]) == 2
    assert "cannot write the output" in capsys.readouterr().err


def test_tenant_salts_follow_the_salt_key_variable_across_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = {**TURN_1, "tenant": "acme"}
    monkeypatch.setenv("CONTEXTPILOT_SALT_KEY", "k" * 32)
    first = _run(tmp_path, line)[1][0]["cache_salt"]
    assert _run(tmp_path, line)[1][0]["cache_salt"] == first  # another run, the same key
    monkeypatch.setenv("CONTEXTPILOT_SALT_KEY", "j" * 32)
    assert _run(tmp_path, line)[1][0]["cache_salt"] != first


def _environ() -> dict[str, str]:
    import os

    return {key: value for key, value in os.environ.items() if key != "PYTHONIOENCODING"}


def test_the_pilots_errors_name_the_lines_keys(tmp_path: Path) -> None:
    long_question = {"question": "why? " * 400_000, "documents": ["a"]}
    bad_answer = {"conversation_id": "c1", "answer": "broken \ud800 text"}
    code, out = _run(tmp_path, TURN_1, long_question, bad_answer)
    assert code == 1
    assert out[1]["error"]["message"].startswith("'question' is ")
    assert out[2]["error"]["message"].startswith("'answer' ")
    assert out[1]["error"]["type"] == "InvalidInputError"
