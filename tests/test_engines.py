"""The engine manager (contextpilot_rag.engines): process safety with a stand-in engine
(a real HTTP server on loopback that spawns a child, as vLLM spawns its engine core),
install detection on a fake engine home, the CLI, and — marked ``engine`` — the real
vLLM CPU build when it is installed (``contextpilot-rag engine install``)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from contextpilot_rag.bench.engine_suite import engine_tokenizer
from contextpilot_rag.cli import main
from contextpilot_rag.engines import (
    MODELS,
    EngineNotInstalledError,
    EngineStartError,
    InstalledEngine,
    InstallEvent,
    KVEventPorts,
    LaunchSpec,
    RunningEngine,
    check_loopback,
    default_vllm_dtype,
    external_engine,
    free_port,
    install_engine,
    installed_engine,
    launch_engine,
    start_engine,
    usable_cpus,
    vllm_launch_spec,
)
from contextpilot_rag.engines._llama_build import cpu_flags
from contextpilot_rag.engines.cache_info import (
    kv_cache_tokens_from_log,
    kv_cache_tokens_from_metrics,
)
from contextpilot_rag.engines.home import EngineLayout, engine_home
from contextpilot_rag.engines.launch import normalise_extra_args
from contextpilot_rag.engines.processes import group_members, is_running, process_info
from contextpilot_rag.engines.state import read_records
from contextpilot_rag.errors import ConfigError

STAND_IN = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    port, pids_file, child_mode, ready_after_s = sys.argv[1:5]
    CHILD = {
        "plain": "import time; time.sleep(600)",
        "stubborn": "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "time.sleep(600)",
    }[child_mode]
    child = subprocess.Popen([sys.executable, "-c", CHILD])
    ready_at = time.monotonic() + float(ready_after_s)
    METRICS = 'vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="1000"} 1.0\\n'


    class Handler(BaseHTTPRequestHandler):
        def reply(self, status, body, kind="application/json"):
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self.reply(200 if time.monotonic() >= ready_at else 503, "{}")
            elif self.path == "/v1/models":
                self.reply(200, json.dumps({"data": [{"id": "stand-in", "object": "model"}]}))
            elif self.path == "/metrics":
                self.reply(200, METRICS, "text/plain")
            else:
                self.reply(404, "{}")

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path == "/apply-template":  # llama-server's chat template
                text = " ".join(m["role"] + ": " + m["content"] for m in body["messages"])
                self.reply(200, json.dumps({"prompt": text + " assistant:"}))
            elif self.path == "/tokenize":  # llama-server's: word lengths, [1] = BOS
                words = [len(w) for w in str(body.get("content", "")).split()]
                special = [1] if body.get("add_special") else []
                self.reply(200, json.dumps({"tokens": special + words}))
            else:
                self.reply(200 if self.path == "/reset_prefix_cache" else 404, "{}")

        def log_message(self, *args):
            pass


    server = ThreadingHTTPServer(("127.0.0.1", int(port)), Handler)
    with open(pids_file + ".partial", "w") as out:
        json.dump({"server": os.getpid(), "child": child.pid}, out)
    os.replace(pids_file + ".partial", pids_file)
    print("stand-in serving", flush=True)
    server.serve_forever()
    """
)

# Runs in a child interpreter: starts the stand-in, prints the watchdog's pid, then
# waits to be killed. Its own exit hook is registered before the engines package is
# imported, so it runs after the package's hook and reports what was still alive then.
PARENT = textwrap.dedent(
    """
    import atexit, json, signal, sys, time
    from pathlib import Path

    # Ctrl-C must raise here even when the test process passed SIGINT down as ignored
    # (an interpreter keeps an inherited SIG_IGN; some earlier test leaves it so).
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def alive(pid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return stat[stat.rindex(")") + 2] not in "ZX"

    watched = []
    atexit.register(lambda: print("ALIVE_AT_EXIT", [p for p in watched if alive(p)], flush=True))

    from contextpilot_rag.engines import LaunchSpec, detach_engine, launch_engine

    options = json.loads(sys.argv[1])
    spec = LaunchSpec(
        command=tuple(options["command"]), port=options["port"], model_name="stand-in",
        kind="vllm", log_path=Path(options["log"]), startup_timeout_s=20, stop_grace_s=1,
    )
    engine = launch_engine(spec)
    pids = json.loads(Path(options["pids"]).read_text())
    watched.extend([engine.pid, pids["server"], pids["child"]])
    if options.get("detach_to"):
        detach_engine(engine, Path(options["detach_to"]))
        print("READY", json.dumps(watched), flush=True)
        sys.exit(0)
    print("READY", json.dumps(watched), flush=True)
    time.sleep(600)
    """
)


class StandIn:
    """Builds launch specs for the stand-in engine in one temporary directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.script = directory / "stand_in.py"
        self.script.write_text(STAND_IN)
        self.pids_file = directory / "pids.json"
        self.log = directory / "logs" / "stand-in.log"

    def command(
        self, port: int, child: str = "plain", ready_after_s: float = 0.5
    ) -> tuple[str, ...]:
        return (
            sys.executable,
            str(self.script),
            str(port),
            str(self.pids_file),
            child,
            str(ready_after_s),
        )

    def spec(self, **overrides: object) -> LaunchSpec:
        port = free_port()
        child = str(overrides.pop("child", "plain"))
        ready = float(overrides.pop("ready_after_s", 0.5))  # type: ignore[arg-type]
        options: dict[str, object] = {
            "command": self.command(port, child, ready),
            "port": port,
            "model_name": "stand-in",
            "kind": "vllm",
            "log_path": self.log,
            "startup_timeout_s": 20.0,
            "stop_grace_s": 1.0,
        }
        options.update(overrides)
        return LaunchSpec(**options)  # type: ignore[arg-type]

    def pids(self) -> dict[str, int]:
        return {name: int(pid) for name, pid in json.loads(self.pids_file.read_text()).items()}

    def parent(self, detach_to: Path | None = None) -> tuple[subprocess.Popen[str], list[int]]:
        """A child interpreter that starts the stand-in; its pid list once ready."""
        port = free_port()
        options = {
            "command": self.command(port),
            "port": port,
            "log": str(self.log),
            "pids": str(self.pids_file),
            "detach_to": str(detach_to) if detach_to else None,
        }
        process = subprocess.Popen(
            [sys.executable, "-c", PARENT, json.dumps(options)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("READY "):
                return process, [int(pid) for pid in json.loads(line.split(" ", 1)[1])]
        process.wait(timeout=10)
        raise AssertionError(f"the parent never got ready (exit {process.returncode})")


def wait_until_gone(pids: list[int], timeout_s: float = 6.0) -> list[int]:
    """The pids still alive after ``timeout_s`` (an empty list when all are gone)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if is_running(pid)]
        if not alive:
            return []
        time.sleep(0.05)
    return [pid for pid in pids if is_running(pid)]


@pytest.fixture
def stand_in(tmp_path: Path) -> StandIn:
    return StandIn(tmp_path)


@pytest.fixture
def fake_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EngineLayout:
    home = tmp_path / "engine-home"
    monkeypatch.setenv("CONTEXTPILOT_ENGINE_HOME", str(home))
    return EngineLayout(home)


# --- process safety -------------------------------------------------------------------


def test_start_waits_for_health_and_stop_ends_the_server_and_its_child(
    stand_in: StandIn,
) -> None:
    engine = launch_engine(stand_in.spec(ready_after_s=1.0))
    try:
        assert engine.healthy()  # the stand-in answers 503 for its first second
        pids = stand_in.pids()
        assert is_running(pids["server"]) and is_running(pids["child"])
        assert set(group_members(engine.pid)) == {engine.pid, pids["server"], pids["child"]}
        assert engine.base_url == f"http://127.0.0.1:{engine.port}/v1"
        assert engine.kv_cache_tokens == 32_000  # num_gpu_blocks × block_size from /metrics
        assert engine.reset_prefix_cache() is True
    finally:
        engine.stop()
    assert wait_until_gone([engine.pid, pids["server"], pids["child"]], timeout_s=1.0) == []
    assert group_members(engine.pid) == []


def test_a_running_engine_keeps_the_environment_it_was_started_with(stand_in: StandIn) -> None:
    bind = {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    with launch_engine(stand_in.spec(env=bind)) as engine:
        assert engine.env == bind  # what the suite reports beside the flags


def test_a_llama_server_reset_restarts_the_same_command_on_the_same_port(
    stand_in: StandIn,
) -> None:
    engine = launch_engine(stand_in.spec(kind="llama-server", ready_after_s=0.2))
    try:
        first, leader, port = stand_in.pids(), engine.pid, engine.port
        assert engine.reset_prefix_cache() is True  # no global reset: a cold restart
        assert wait_until_gone([leader, first["server"], first["child"]]) == []
        second = stand_in.pids()
        assert second["server"] != first["server"] and engine.pid != leader
        assert engine.port == port and engine.healthy()
        assert set(group_members(engine.pid)) == {engine.pid, second["server"], second["child"]}
    finally:
        engine.stop()
    assert wait_until_gone([engine.pid, second["server"], second["child"]]) == []


def test_the_suite_tokenizes_with_llama_servers_template_and_tokenizer(
    stand_in: StandIn,
) -> None:
    engine = launch_engine(stand_in.spec(kind="llama-server", ready_after_s=0.2))
    try:
        with httpx.Client(timeout=10) as http:
            found = engine_tokenizer(http, engine.base_url, engine.model_name)
            assert found is not None  # the vLLM form gets no tokens: llama-server's is used
            chat, text = found
            messages = [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
            ]
            # "system: be brief user: hi assistant:" with the BOS the server adds to chats
            assert chat(messages) == [1, 7, 2, 5, 5, 2, 10]
            assert text("an answer") == [2, 6] and text("") == []
    finally:
        engine.stop()


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(
    stand_in: StandIn,
) -> None:
    with launch_engine(stand_in.spec(child="stubborn")) as engine:
        child = stand_in.pids()["child"]
    assert wait_until_gone([child, engine.pid], timeout_s=1.0) == []


def test_the_engine_dies_with_its_parent_on_sigkill(stand_in: StandIn) -> None:
    parent, pids = stand_in.parent()
    assert all(is_running(pid) for pid in pids)
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=5)
    assert wait_until_gone(pids, timeout_s=5.0) == []


def test_ctrl_c_in_the_parent_stops_the_engine_before_the_parent_exits(
    stand_in: StandIn,
) -> None:
    parent, pids = stand_in.parent()
    parent.send_signal(signal.SIGINT)
    output, _ = parent.communicate(timeout=20)
    assert "KeyboardInterrupt" in output
    assert "ALIVE_AT_EXIT []" in output  # the exit hook had stopped the group already
    assert wait_until_gone(pids, timeout_s=1.0) == []


def test_a_detached_engine_outlives_its_parent_until_engine_stop(
    stand_in: StandIn, fake_home: EngineLayout
) -> None:
    parent, pids = stand_in.parent(detach_to=fake_home.run_dir)
    assert parent.wait(timeout=10) == 0
    [(path, record)] = read_records(fake_home.run_dir)
    assert record is not None and record.pid == pids[0] and record.is_running()
    time.sleep(0.5)  # the watchdog polls its parent every 0.1 s
    assert all(is_running(pid) for pid in pids)
    assert httpx.get(f"{record.base_url}/models", trust_env=False).status_code == 200
    assert main(["engine", "stop", "--port", str(record.port)]) == 0
    assert wait_until_gone(pids, timeout_s=1.0) == []
    assert not path.exists()


@pytest.mark.parametrize(
    ("started", "stop_args"),
    [("earlier", ["--all"]), (None, ["--port", "8030"])],
    ids=["recycled-pid", "record-without-a-start-time"],
)
def test_engine_stop_never_signals_a_process_its_record_cannot_prove_is_the_engine(
    fake_home: EngineLayout, started: str | None, stop_args: list[str]
) -> None:
    """A pid reused by another process (the recorded engine started earlier), or a
    hand-edited record without a start time: the record is stale and removed, and the
    process holding that pid now is left alone."""
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        info = process_info(bystander.pid)
        assert info is not None
        record = {
            "kind": "vllm",
            "model_name": "m",
            "port": 8030,
            "base_url": "http://127.0.0.1:8030/v1",
            "pid": bystander.pid,
            "pgid": info.pgid,
            "start_ticks": None if started is None else info.start_ticks - 1,
            "command": ["python", "-m", "vllm"],
            "log_path": "/dev/null",
            "started_at": 0.0,
        }
        fake_home.run_dir.mkdir(parents=True)
        state_file = fake_home.run_dir / "vllm-8030.json"
        state_file.write_text(json.dumps(record))
        assert main(["engine", "stop", *stop_args]) == 0
        time.sleep(0.2)
        assert bystander.poll() is None and is_running(bystander.pid)
        assert not state_file.exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_engine_start_on_port_0_is_a_usage_error(fake_home: EngineLayout) -> None:
    assert main(["engine", "start", "--port", "0"]) == 2  # not the default port


@pytest.mark.parametrize("port", ["0", "70000", "-1"])
def test_engine_stop_on_a_port_outside_the_range_is_a_usage_error(
    fake_home: EngineLayout, port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["engine", "stop", "--port", port]) == 2
    assert "1..65535" in capsys.readouterr().out


def test_an_engine_that_exits_during_startup_raises_with_its_log(stand_in: StandIn) -> None:
    command = (sys.executable, "-c", "print('model file is corrupt'); raise SystemExit(3)")
    spec = stand_in.spec(command=command)
    with pytest.raises(EngineStartError, match="exited during start-up") as caught:
        launch_engine(spec)
    assert "model file is corrupt" in caught.value.log_tail


def test_an_engine_that_never_gets_healthy_is_stopped_at_the_timeout(
    stand_in: StandIn,
) -> None:
    with pytest.raises(EngineStartError, match=r"within 1\.5 s"):
        launch_engine(stand_in.spec(ready_after_s=600, startup_timeout_s=1.5))
    pids = stand_in.pids()
    assert wait_until_gone([pids["server"], pids["child"]], timeout_s=1.0) == []


def test_a_busy_port_is_refused_before_anything_starts(stand_in: StandIn) -> None:
    with launch_engine(stand_in.spec()) as engine:
        first = stand_in.pids()
        spec = stand_in.spec()
        busy = LaunchSpec(**{**spec.__dict__, "port": engine.port})
        with pytest.raises(EngineStartError, match="already in use"):
            launch_engine(busy)
        assert stand_in.pids() == first  # no second stand-in was spawned


def test_an_engine_starts_again_on_a_port_its_predecessors_connections_still_hold(
    stand_in: StandIn,
) -> None:
    """Stop, then start on the same port while the stopped engine's side of a closed
    client connection waits in TIME_WAIT (about a minute): the engine binds as servers
    do (SO_REUSEADDR), so the start goes ahead."""
    spec = stand_in.spec()
    engine = launch_engine(spec)
    client = socket.create_connection(("127.0.0.1", spec.port))  # a pooled connection
    engine.stop()  # the server closes first: its side of the connection waits
    client.close()
    with launch_engine(spec) as again:
        assert httpx.get(f"{again.root_url}/health", timeout=5).status_code == 200


def test_non_loopback_hosts_are_refused(fake_home: EngineLayout, stand_in: StandIn) -> None:
    for host in ("0.0.0.0", "192.168.1.10", "::", "example.com", "127.0.0.1 "):
        with pytest.raises(ConfigError, match="loopback"):
            check_loopback(host)
        with pytest.raises(ConfigError, match="loopback"):
            stand_in.spec(host=host)
        # refused before the (absent) install is even looked up
        with pytest.raises(ConfigError, match="loopback"):
            start_engine("vllm", host=host)
    assert check_loopback("localhost") == "127.0.0.1"
    # also abbreviated, as vLLM's argparse reads them; other flags pass
    for extra in (("--host=0.0.0.0",), ("--ho", "0.0.0.0"), ("--hos=::",), ("--por", "9")):
        with pytest.raises(ConfigError, match="--host"):
            start_engine("vllm", extra_args=extra)
    assert normalise_extra_args(("--seed", "0", "--hf-token", "t")) == (
        "--seed",
        "0",
        "--hf-token",
        "t",
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"block_size": 16}, "multiple of 32"),
        ({"kv_cache_gib": 0}, "GiB"),
        ({"max_model_len": 100_000}, "max_model_len"),
        ({"port": 70_000}, "port"),
        ({"extra_args": "--seed 0"}, "sequence of strings"),
        ({"dtype": "float16"}, "dtype"),
        ({"cpu_bind": "all"}, "cpu_bind"),
        ({"cpu_bind": "0-1\n"}, "cpu_bind"),  # a final newline would reach the engine's env
        ({"port": 8030, "kv_events": KVEventPorts(8029, 8030)}, "also a KV event port"),
        ({"port": 8030, "kv_events": KVEventPorts(8030)}, "also a KV event port"),
    ],
)
def test_bad_start_arguments_are_config_errors(
    fake_home: EngineLayout, arguments: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        start_engine("vllm", **arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), 0, -1])
def test_a_startup_timeout_that_is_no_positive_finite_number_is_a_config_error(
    stand_in: StandIn, seconds: float
) -> None:
    with pytest.raises(ConfigError, match="startup_timeout_s"):
        stand_in.spec(startup_timeout_s=seconds)


def test_a_kv_events_port_without_room_for_its_replay_port_is_a_usage_error(
    fake_home: EngineLayout, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["engine", "start", "--kv-events-port", "65535"]) == 2
    assert "65535 is not in 1..65534" in capsys.readouterr().out


def test_an_engine_home_that_cannot_be_made_fails_with_a_message_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("CONTEXTPILOT_ENGINE_HOME", str(tmp_path / "a-file" / "engines"))
    assert main(["engine", "install", "--engine", "llama-server"]) == 1
    assert "engine home" in capsys.readouterr().out


def test_usable_cpus_is_a_core_list_start_engine_accepts(fake_home: EngineLayout) -> None:
    with pytest.raises(EngineNotInstalledError):  # past the argument checks
        start_engine("vllm", cpu_bind=usable_cpus())


def test_gemma_runs_on_llama_server_only() -> None:
    with pytest.raises(ConfigError, match="llama-server"):
        start_engine("vllm", "gemma3")
    assert main(["engine", "start", "--engine", "vllm", "--model", "gemma3"]) == 2


# --- llama-server build flags ---------------------------------------------------------

SAPPHIRE_RAPIDS_FLAGS = (
    "fpu sse4_2 avx avx2 fma f16c bmi2 avx512f avx512dq avx512cd avx512bw avx512vl "
    "avx512vbmi avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8"
)


def test_llama_server_on_x86_names_the_cpus_instruction_sets_and_never_amx() -> None:
    cpuinfo = f"processor\t: 0\nflags\t\t: {SAPPHIRE_RAPIDS_FLAGS}\n\nflags\t: avx\n"
    flags = cpu_flags("x86_64", cpuinfo)
    assert "-DGGML_NATIVE=OFF" in flags  # -march=native would turn AMX on
    for option in ("AVX2", "FMA", "AVX512", "AVX512_VNNI", "AVX512_BF16", "AVX512_VBMI"):
        assert f"-DGGML_{option}=ON" in flags
    assert "-DGGML_AVX_VNNI=OFF" in flags  # not listed
    for option in ("AMX_TILE", "AMX_INT8", "AMX_BF16"):
        assert f"-DGGML_{option}=OFF" in flags


def test_avx512_needs_every_subset_ggml_compiles_it_with() -> None:
    flags = cpu_flags("x86_64", "flags : avx avx2 avx512f avx512cd avx512vl avx512dq\n")
    assert "-DGGML_AVX512=OFF" in flags and "-DGGML_AVX2=ON" in flags


def test_other_machines_and_unreadable_cpuinfo_build_native() -> None:
    assert cpu_flags("aarch64", "Features : fp asimd\n") == ("-DGGML_NATIVE=ON",)
    assert cpu_flags("x86_64", "") == ("-DGGML_NATIVE=ON",)


# --- install detection ----------------------------------------------------------------

FAKE_PYTHON = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/calls.log"
if [ "$1" = "-c" ]; then echo 0.32.0; fi
exit 0
"""


def make_fake_vllm_install(layout: EngineLayout, *, stamped: bool) -> Path:
    """A vLLM venv whose python 'imports vllm' and logs every call; the model files."""
    python = layout.vllm_python
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    spec = MODELS["smollm2"]
    layout.models_dir.mkdir(parents=True)
    spec.gguf_path(layout.models_dir).write_bytes(b"GGUF")
    spec.hf_path(layout.models_dir).mkdir()
    (spec.hf_path(layout.models_dir) / "config.json").write_text("{}")
    if stamped:
        stamp = {"kind": "vllm", "version": "0.32.0", "size_bytes": 1, "installed_at": "x"}
        layout.stamp("vllm").write_text(json.dumps(stamp))
    return python.parent / "calls.log"


def test_a_complete_install_is_detected_and_not_redone(fake_home: EngineLayout) -> None:
    calls = make_fake_vllm_install(fake_home, stamped=True)
    events: list[InstallEvent] = []
    installed = install_engine("vllm", progress=events.append)
    assert [event.state for event in events if event.state != "start"] == ["skipped"] * 3
    assert calls.read_text().splitlines() == ["-c import vllm; print(vllm.__version__)"]
    assert installed == installed_engine("vllm")
    assert installed.model_path == fake_home.models_dir / "smollm2-135m-instruct-hf"
    assert installed.executable == fake_home.vllm_python


def test_a_working_venv_without_stamp_is_adopted_without_pip(fake_home: EngineLayout) -> None:
    calls = make_fake_vllm_install(fake_home, stamped=False)
    assert installed_engine("vllm") is None
    events: list[InstallEvent] = []
    installed = install_engine("vllm", progress=events.append)
    assert events[1] == InstallEvent("vLLM CPU venv", "adopted", events[1].elapsed_s)
    assert "-m pip" not in calls.read_text()
    assert installed.version == "0.32.0"
    assert json.loads(fake_home.stamp("vllm").read_text())["adopted"] is True


def test_an_install_missing_its_converted_model_is_not_complete(fake_home: EngineLayout) -> None:
    make_fake_vllm_install(fake_home, stamped=True)
    (MODELS["smollm2"].hf_path(fake_home.models_dir) / "config.json").unlink()
    assert installed_engine("vllm") is None
    assert installed_engine("llama-server") is None


def test_the_engine_home_follows_the_environment(tmp_path: Path) -> None:
    assert engine_home({"CONTEXTPILOT_ENGINE_HOME": str(tmp_path)}) == tmp_path
    assert engine_home({"XDG_CACHE_HOME": "/c"}) == Path("/c/contextpilot-rag/engines")
    assert engine_home({}) == Path.home() / ".cache" / "contextpilot-rag" / "engines"
    assert EngineLayout(tmp_path).vllm_venv == tmp_path / "vllm" / "venv"


def test_a_publishers_chat_template_is_found_in_the_kept_llama_cpp_sources(
    tmp_path: Path,
) -> None:
    layout = EngineLayout(tmp_path)
    assert layout.chat_template("google-gemma-2-2b-it.jinja") is None
    templates = layout.llama_dir / "src" / "pkg-1.0" / "vendor" / "llama.cpp" / "models"
    (templates / "templates").mkdir(parents=True)
    (templates / "templates" / "google-gemma-2-2b-it.jinja").write_text("{{ x }}")
    found = layout.chat_template("google-gemma-2-2b-it.jinja")
    assert found is not None and found.read_text() == "{{ x }}"
    assert layout.chat_template("other.jinja") is None


# --- commands, flags, reports ---------------------------------------------------------


def test_vllm_flags_keep_every_socket_on_loopback(fake_home: EngineLayout) -> None:
    make_fake_vllm_install(fake_home, stamped=True)
    installed = installed_engine("vllm")
    assert isinstance(installed, InstalledEngine)
    spec = vllm_launch_spec(installed, port=8030, kv_events=KVEventPorts(5557, 5558))
    flags = list(spec.command)
    assert flags[flags.index("--host") + 1] == "127.0.0.1"
    assert flags[flags.index("--block-size") + 1] == "32"
    assert {"--enable-prefix-caching", "--enable-prompt-tokens-details"} <= set(flags)
    events = json.loads(flags[flags.index("--kv-events-config") + 1])
    assert events["endpoint"] == "tcp://127.0.0.1:5557"  # vLLM connects; no wildcard bind
    assert events["replay_endpoint"] == "tcp://127.0.0.1:5558"
    assert spec.env["VLLM_CPU_KVCACHE_SPACE"] == "2" and spec.env["HF_HUB_OFFLINE"] == "1"
    assert spec.env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"  # not one shared pinned core
    assert flags[flags.index("--dtype") + 1] in ("bfloat16", "float32")
    bf16 = vllm_launch_spec(installed, port=8030, dtype="bfloat16").command
    assert bf16[bf16.index("--dtype") + 1] == "bfloat16"


@pytest.mark.parametrize(
    ("cores", "expected"),
    [({0, 1}, "0-1"), ({0, 2, 3}, "0,2-3"), ({5}, "5"), ({0, 1, 2, 4, 6, 7}, "0-2,4,6-7")],
)
def test_usable_cpus_lists_the_cores_this_process_may_use(
    monkeypatch: pytest.MonkeyPatch, cores: set[int], expected: str
) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: cores, raising=False)
    assert usable_cpus() == expected


def test_vllm_computes_in_float32_unless_the_cpu_has_native_bf16() -> None:
    assert default_vllm_dtype("flags : fpu sse avx2 fma") == "float32"
    assert default_vllm_dtype("flags : avx2 avx512f avx512_bf16") == "bfloat16"
    assert default_vllm_dtype("flags : avx2 amx_bf16 amx_tile") == "bfloat16"


def test_kv_cache_capacity_is_read_from_metrics_or_log() -> None:
    metrics = '# HELP x\nvllm:cache_config_info{block_size="32",num_gpu_blocks="2048"} 1.0\n'
    assert kv_cache_tokens_from_metrics(metrics) == 65_536
    assert kv_cache_tokens_from_metrics('vllm:cache_config_info{num_gpu_blocks="None"} 1') is None
    log = "(EngineCore pid=1) INFO [kv_cache_utils.py:2328] CPU KV cache size: 43,690 tokens, "
    assert kv_cache_tokens_from_log(log) == 43_690
    assert kv_cache_tokens_from_log("nothing here") is None


def test_an_external_engine_is_never_stopped_or_reset() -> None:
    engine = external_engine("http://gpu-box:8000/", "llama-3")
    assert engine.base_url == "http://gpu-box:8000/v1"
    assert external_engine("https://h/v1", "m").base_url == "https://h/v1"
    engine.stop()  # nothing to stop: the server is not ours
    assert engine.reset_prefix_cache() is False
    with pytest.raises(ConfigError):
        external_engine("gpu-box:8000", "llama-3")


def test_a_plain_stop_removes_stale_records_rather_than_asking_which_to_stop(
    fake_home: EngineLayout, capsys: pytest.CaptureFixture[str]
) -> None:
    """Records left by engines that died (a crash, a reboot) are not engines running:
    a plain ``engine stop`` removes them instead of asking for ``--port``."""
    fake_home.run_dir.mkdir(parents=True)
    for port in (8012, 8030):
        record = {
            "kind": "vllm",
            "model_name": "m",
            "port": port,
            "base_url": f"http://127.0.0.1:{port}/v1",
            "pid": 2**22 + port,  # above any pid this machine hands out: no process
            "pgid": 2**22 + port,
            "start_ticks": 1,
            "command": ["python", "-m", "vllm"],
            "log_path": "/dev/null",
            "started_at": 0.0,
        }
        (fake_home.run_dir / f"vllm-{port}.json").write_text(json.dumps(record))
    assert main(["engine", "stop"]) == 0
    assert capsys.readouterr().out.count("removed its stale record") == 2
    assert list(fake_home.run_dir.iterdir()) == []


def test_status_lists_installed_engines_and_stale_records(
    fake_home: EngineLayout, capsys: pytest.CaptureFixture[str]
) -> None:
    make_fake_vllm_install(fake_home, stamped=True)
    assert main(["engine", "status"]) == 0
    out = capsys.readouterr().out
    assert "0.32.0" in out and "not installed" in out and "smollm2" in out


def test_python_dash_m_runs_the_same_commands() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "contextpilot_rag.engines", "stop", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0 and "--all" in result.stdout


# --- memory an engine can take --------------------------------------------------------


def _fake_machine(
    root: Path, *, node_kb: dict[str, int] | None, meminfo_kb: int | None = None
) -> None:
    """A /sys and /proc with core 0 (and 1) on NUMA node 1, where ``node_kb`` gives its
    meminfo fields; ``None``: a kernel that shows no nodes."""
    for core in (0, 1):
        cpu = root / "sys/devices/system/cpu" / f"cpu{core}"
        cpu.mkdir(parents=True)
        if node_kb is not None:
            (cpu / "node1").mkdir()  # a symlink on Linux; a directory does as well here
    if node_kb is not None:
        node = root / "sys/devices/system/node/node1"
        node.mkdir(parents=True)
        lines = ["Node 1 MemTotal:       99999999 kB"]
        lines += [f"Node 1 {name}:       {kb} kB" for name, kb in node_kb.items()]
        (node / "meminfo").write_text("\n".join(lines) + "\n")
    if meminfo_kb is not None:
        (root / "proc").mkdir(parents=True)
        (root / "proc/meminfo").write_text(
            f"MemTotal: 99999999 kB\nMemFree: 1 kB\nMemAvailable: {meminfo_kb} kB\n"
        )


NODE_KB = {"MemFree": 4000, "Active(file)": 300, "Inactive(file)": 200, "SReclaimable": 100}


def test_available_memory_is_counted_on_the_engines_numa_node_as_vllm_counts_it(
    tmp_path: Path,
) -> None:
    from contextpilot_rag.engines.memory import available_memory_bytes

    _fake_machine(tmp_path, node_kb=NODE_KB, meminfo_kb=50_000)
    # free + file-backed + reclaimable on node 1, not the machine's MemAvailable
    assert available_memory_bytes("0-1", root=tmp_path) == 4600 * 1024
    assert available_memory_bytes("1", root=tmp_path) == 4600 * 1024


def test_available_memory_falls_back_to_the_machine_and_keeps_to_the_cgroup_limit(
    tmp_path: Path,
) -> None:
    from contextpilot_rag.engines.memory import available_memory_bytes

    _fake_machine(tmp_path, node_kb=None, meminfo_kb=50_000)
    assert available_memory_bytes("0", root=tmp_path) == 50_000 * 1024
    cgroup = tmp_path / "sys/fs/cgroup"
    cgroup.mkdir(parents=True)
    (cgroup / "memory.max").write_text("max\n")  # no limit
    assert available_memory_bytes("0", root=tmp_path) == 50_000 * 1024
    (cgroup / "memory.max").write_text(f"{30_000 * 1024}\n")
    (cgroup / "memory.current").write_text(f"{10_000 * 1024}\n")
    assert available_memory_bytes("0", root=tmp_path) == 20_000 * 1024
    (cgroup / "memory.current").write_text(f"{40_000 * 1024}\n")  # over: nothing left
    assert available_memory_bytes("0", root=tmp_path) == 0


def test_a_vllm_cache_that_cannot_fit_is_refused_before_anything_starts(
    fake_home: EngineLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contextpilot_rag.engines import start

    calls = make_fake_vllm_install(fake_home, stamped=True)
    seen: list[str] = []

    def available(cpu_bind: str) -> int:
        seen.append(cpu_bind)
        return int(9.7 * 2**30)  # what vLLM saw on a 2-core AMD machine's node

    monkeypatch.setattr(start, "available_memory_bytes", available)
    with pytest.raises(ConfigError, match=r"kv_cache_gib=12 does not fit.*at most 7"):
        start_engine("vllm", kv_cache_gib=12, cpu_bind="0-1")
    assert seen == ["0-1"]
    assert not calls.exists()  # the engine was never run
    # one that fits goes on to the launch (the fake engine then fails to serve)
    with pytest.raises(EngineStartError):
        start_engine("vllm", kv_cache_gib=7, cpu_bind="0-1", startup_timeout_s=5)
    monkeypatch.setattr(start, "available_memory_bytes", lambda cpu_bind: None)
    with pytest.raises(EngineStartError):  # unknown memory: not checked
        start_engine("vllm", kv_cache_gib=12, startup_timeout_s=5)


def test_available_memory_is_unknown_where_nothing_can_be_read(tmp_path: Path) -> None:
    from contextpilot_rag.bench.engine_report import suite_kv_cache_gib
    from contextpilot_rag.engines.memory import available_memory_bytes

    _fake_machine(tmp_path, node_kb={"MemFree": 4000}, meminfo_kb=None)  # fields missing
    assert available_memory_bytes("0", root=tmp_path) is None
    assert available_memory_bytes("0", root=tmp_path / "elsewhere") is None
    assert suite_kv_cache_gib("float32", available_bytes=None) >= 1


# --- the real vLLM CPU build ----------------------------------------------------------

VLLM = installed_engine("vllm")


@pytest.fixture(scope="module")
def vllm() -> Iterator[RunningEngine]:
    with start_engine("vllm", block_size=32, max_model_len=4096, startup_timeout_s=900) as engine:
        yield engine


def chat(engine: RunningEngine, prompt: str) -> dict[str, object]:
    body = {
        "model": engine.model_name,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 4,
        "temperature": 0,
    }
    response = httpx.post(f"{engine.base_url}/chat/completions", json=body, timeout=120)
    response.raise_for_status()
    usage: dict[str, object] = response.json()["usage"]
    return usage


def cached_tokens(usage: dict[str, object]) -> int:
    details = usage.get("prompt_tokens_details") or {}
    assert isinstance(details, dict)
    return int(details.get("cached_tokens") or 0)


needs_vllm: Callable[[Callable[..., None]], Callable[..., None]] = pytest.mark.skipif(
    VLLM is None, reason="vLLM not installed (run `contextpilot-rag engine install`)"
)


@pytest.mark.engine
@needs_vllm
def test_vllm_serves_the_model_and_reports_cached_tokens(vllm: RunningEngine) -> None:
    models = httpx.get(f"{vllm.base_url}/models", timeout=10).json()
    assert [item["id"] for item in models["data"]] == ["smollm2-135m-instruct"]
    assert vllm.kv_cache_tokens is not None and vllm.kv_cache_tokens > 10_000
    prompt = "Harbour report. " + " ".join(f"Ship {i} arrived at dawn." for i in range(60))
    first = chat(vllm, prompt)
    second = chat(vllm, prompt)
    assert int(str(first["prompt_tokens"])) > 300
    assert cached_tokens(second) >= 256 and cached_tokens(second) % 32 == 0
    assert vllm.reset_prefix_cache() is True
    chat(vllm, "Unrelated warm-up so the reset is applied.")
    assert cached_tokens(chat(vllm, prompt)) < cached_tokens(second)


@pytest.mark.engine
@needs_vllm
def test_the_template_check_reads_vllms_own_rendering(vllm: RunningEngine) -> None:
    """vLLM renders the probe at /tokenize (token ids); SmolLM2's ChatML template keeps
    every turn an extension of the last, with a system message and folded."""
    from contextpilot_rag.engines.template_check import check_chat_template

    check = check_chat_template(vllm.base_url, vllm.model_name, timeout_s=60.0)
    assert check is not None and check.renderer == "/tokenize"
    assert (check.system_message, check.folded, check.advice) == (True, True, None)


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` in the process tree, whatever its group."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, frontier = [], [root]
    while frontier:
        below = children.get(frontier.pop(), [])
        found.extend(below)
        frontier.extend(below)
    return [pid for pid in found if is_running(pid)]


@pytest.mark.engine
@needs_vllm
def test_vllm_stop_leaves_no_process_behind(vllm: RunningEngine) -> None:
    tree = [vllm.pid, *descendants(vllm.pid)]
    assert len(tree) >= 3  # watchdog, API server, engine core (and its workers)
    assert set(vllm.pids()) >= set(tree)  # all in the engine's process group
    vllm.stop()
    assert wait_until_gone(tree, timeout_s=5.0) == []
    assert group_members(vllm.pid) == []
    # other engines may share the model path; the port is this engine's own
    leftover = subprocess.run(
        ["pgrep", "-f", "--", f"--port {vllm.port} "], capture_output=True, check=False
    )
    assert leftover.returncode == 1, leftover.stdout  # 1: nothing matched


@pytest.mark.engine
@pytest.mark.skipif(
    installed_engine("llama-server", "smollm2") is None,
    reason="llama-server not installed (contextpilot-rag engine install --engine llama-server)",
)
def test_llama_server_serves_smollm2_and_stops_cleanly() -> None:
    with start_engine("llama-server", "smollm2", max_model_len=2048, threads=1) as engine:
        tree = [engine.pid, *descendants(engine.pid)]
        assert engine.kv_cache_tokens == 2048 and engine.block_size == 1
        assert "--swa-full" not in engine.flags  # SmolLM2 is full attention
        prompt = "Harbour report. " + " ".join(f"Ship {i} arrived at dawn." for i in range(40))
        models = httpx.get(f"{engine.base_url}/models", timeout=10).json()
        assert models["data"][0]["id"] == "smollm2-135m-instruct"
        first = chat(engine, prompt)
        assert cached_tokens(chat(engine, prompt)) >= int(str(first["prompt_tokens"])) // 2
        restarted_from = tree
        assert engine.reset_prefix_cache() is True  # a restart: slots and host cache empty
        assert cached_tokens(chat(engine, prompt)) == 0
        assert wait_until_gone(restarted_from, timeout_s=5.0) == []
        tree = [engine.pid, *descendants(engine.pid)]
    assert wait_until_gone(tree, timeout_s=5.0) == []


def _chat_template(name: str) -> Path | None:
    """A chat template of llama.cpp's sources, which the llama-server install keeps
    (``models/templates``: the templates the models' publishers ship); ``None``
    without them."""
    installed = installed_engine("llama-server")
    return None if installed is None else installed.layout.chat_template(name)


@pytest.mark.engine
@pytest.mark.parametrize(
    ("template", "system"),
    [
        ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "Answer from the documents."),
        ("google-gemma-2-2b-it.jinja", None),  # Gemma 2's template takes no system turn
    ],
)
def test_a_publishers_chat_template_takes_a_history_with_an_unanswered_turn(
    template: str, system: str | None
) -> None:
    """Mistral's and Gemma's chat templates refuse two user messages in a row
    (llama-server applies them with ``--jinja``): a history turn without its answer is
    sent with the pilot's stand-in answer, which keeps the roles alternating."""
    from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig

    path = _chat_template(template)
    if path is None:
        pytest.skip(
            f"llama-server with its sources' {template} not installed "
            "(contextpilot-rag engine install --engine llama-server)"
        )
    first = ContextBlock("The harbour opens at dawn.", id="harbour")
    second = ContextBlock("The ferry leaves at noon.", id="ferry")

    def second_turn(config: PilotConfig) -> httpx.Response:
        pilot = ContextPilot(config)
        pilot.optimize([first], "When does the harbour open?", conversation_id="c")
        prompt = pilot.optimize([second], "When does the ferry leave?", conversation_id="c")
        body = {"model": engine.model_name, "messages": prompt.to_openai(), "max_tokens": 1}
        return httpx.post(f"{engine.base_url}/chat/completions", json=body, timeout=120)

    flags = ("--jinja", "--chat-template-file", str(path))
    with start_engine("llama-server", max_model_len=2048, threads=1, extra_args=flags) as engine:
        refused = second_turn(PilotConfig(system_prompt=system, unanswered_text=None))
        assert refused.status_code >= 400 and "must alternate" in refused.text, refused.text
        accepted = second_turn(PilotConfig(system_prompt=system))
        assert accepted.status_code == 200, accepted.text


@pytest.mark.engine
def test_a_folded_system_prompt_suits_templates_without_a_first_system_turn() -> None:
    """Gemma 2's template refuses a system message (as transformers renders it, which
    vLLM does; llama-server's own renderer folds it in), and Mistral Nemo's renders it
    before the last user message, so each turn rewrites the history the engine cached.
    With ``PilotConfig(system_into_user=True)`` both take the prompt, and every turn's
    rendered prompt extends the previous turn's (llama-server's ``/apply-template``
    renders the messages as a chat request would be)."""
    from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig

    jinja2 = pytest.importorskip("jinja2")
    paths = [_chat_template(name) for name in _FOLD_TEMPLATES]
    if None in paths:
        pytest.skip(
            "llama-server with its sources' publishers' chat templates not installed "
            "(contextpilot-rag engine install --engine llama-server)"
        )
    blocks = [ContextBlock(f"Fact {n} is about the harbour.", id=f"fact{n}") for n in range(3)]

    def conversation(config: PilotConfig) -> list[list[dict[str, str]]]:
        pilot, turns = ContextPilot(config), []
        for turn, block in enumerate(blocks):
            prompt = pilot.optimize([block], f"What does fact {turn} say?", conversation_id="c")
            turns.append(prompt.to_openai())
            pilot.record_answer("c", f"It says {turn}.")
        return turns

    def extends(prompts: list[str]) -> bool:
        return all(later.startswith(earlier) for earlier, later in itertools.pairwise(prompts))

    def refuse(message: str) -> None:
        raise ValueError(message)

    plain, folded = conversation(PilotConfig()), conversation(PilotConfig(system_into_user=True))
    for name, path in zip(_FOLD_TEMPLATES, paths, strict=True):
        assert path is not None
        template = jinja2.Environment().from_string(path.read_text(encoding="utf-8"))

        def strict(messages: list[dict[str, str]], template: jinja2.Template = template) -> str:
            return str(
                template.render(
                    messages=messages, bos_token="<s>", eos_token="</s>", raise_exception=refuse
                )
            )

        flags = ("--jinja", "--chat-template-file", str(path))
        with start_engine(
            "llama-server", max_model_len=2048, threads=1, extra_args=flags
        ) as engine:
            url = f"http://127.0.0.1:{engine.port}/apply-template"
            served = [
                httpx.post(url, json={"messages": turn}, timeout=60, trust_env=False).json()
                for turn in plain + folded
            ]
        assert extends([answer["prompt"] for answer in served[len(plain) :]]), name
        assert extends([strict(turn) for turn in folded]), name
        if name.startswith("google-gemma-2"):
            with pytest.raises(ValueError, match="System role not supported"):
                strict(plain[0])
        else:
            assert not extends([answer["prompt"] for answer in served[: len(plain)]]), name
            assert not extends([strict(turn) for turn in plain]), name


_FOLD_TEMPLATES = ("google-gemma-2-2b-it.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja")


@pytest.mark.engine
def test_the_template_check_finds_a_moved_system_message_and_its_fix() -> None:
    """Mistral Nemo's template moves the system message (the check advises folding, and
    serve's start-up advice goes once it is set); SmolLM2's own keeps the history."""
    from contextpilot_rag.engines.template_check import check_chat_template
    from contextpilot_rag.serve import ServeConfig
    from contextpilot_rag.serve.cli import template_advice

    path = _chat_template("mistralai-Mistral-Nemo-Instruct-2407.jinja")
    if path is None:
        pytest.skip(
            "llama-server with its sources' chat templates not installed "
            "(contextpilot-rag engine install --engine llama-server)"
        )
    flags = ("--jinja", "--chat-template-file", str(path))
    for extra, keeps in (((), True), (flags, False)):
        started = start_engine("llama-server", max_model_len=2048, threads=1, extra_args=extra)
        with started as engine:
            check = check_chat_template(engine.base_url, engine.model_name)
            config = ServeConfig(endpoints=(engine.base_url,), model=engine.model_name)
            advice = template_advice(config)
            folded = template_advice(dataclasses.replace(config, system_into_user=True))
        assert check is not None and check.renderer == "/apply-template"
        assert (check.system_message, check.folded) == (keeps, True)
        assert (advice is None) == keeps and folded is None
        if not keeps:
            assert advice is not None and "--system-into-user" in advice
