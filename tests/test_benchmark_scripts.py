"""The benchmark scripts of ``benchmarks/`` run from the checkout, write generated
sections, and use only the package's public names."""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path
from typing import Any

import bench
import engine
import families
import pytest
import soak
from lib.sections import begin_marker, end_marker

from contextpilot_rag.bench.commands import add_engine_arguments

ROOT = Path(__file__).resolve().parent.parent


def test_quick_bench_writes_its_generated_section(tmp_path: Path) -> None:
    report = tmp_path / "bench.md"
    report.write_text("# Benchmarks\n\nprose kept\n", encoding="utf-8")
    argv = ["--quick", "--no-reference", "--runs", "2", "--latency-requests", "400"]
    assert bench.main([*argv, "--batch-sizes", "300", "--write", str(report)]) == 0
    text = report.read_text(encoding="utf-8")
    assert text.startswith("# Benchmarks\n\nprose kept\n")
    assert begin_marker("bench") in text and text.rstrip().endswith(end_marker("bench"))
    assert "- runs: 2;" in text
    assert "hit ratio" in text.lower() and "latency" in text.lower()
    assert "### Batch mode" in text and "#### 75 requests" in text
    assert "2 runs)" in text  # timings show their spread over the runs


def test_small_families_run_writes_targets_bounds_and_every_family(tmp_path: Path) -> None:
    report = tmp_path / "bench.md"
    report.write_text("# Benchmarks\n", encoding="utf-8")
    argv = ["--count", "2", "--requests", "80", "--turns", "30", "--shape-requests", "120"]
    argv += ["--small-instances", "2", "--no-reference", "--jobs", "1"]
    image = tmp_path / "img" / "families.png"
    assert families.main([*argv, "--write", str(report), "--plot", str(image)]) == 0
    assert image.stat().st_size > 0  # one panel per family and one for the small instances
    text = report.read_text(encoding="utf-8")
    assert begin_marker("families") in text and text.rstrip().endswith(end_marker("families"))
    for family in families.FAMILIES:
        assert f"### {family}: every workload" in text
    assert "batch, D=2,000 k=15: batch hit ratio, worst held-out | >= 38.0%" in text
    assert "build + schedule, 2,000 requests, slowest held-out | <= 2.00 s" in text
    assert "120 requests, D = 2,000, k = 15" in text
    # every workload's ours stays within its bound: "ours of bound" never passes 100%
    shares = re.findall(r"\| (\d+\.\d)% \| (?:not run|no multi-turn mode) \|", text)
    assert shares and all(float(share) <= 100.0 for share in shares)
    assert "### Small batch instances" in text and "![workload families](img/families.png)" in text


def test_families_without_small_instances_leave_their_table_out(tmp_path: Path) -> None:
    report = tmp_path / "bench.md"
    report.write_text("# Benchmarks\n", encoding="utf-8")
    argv = ["--families", "multi-turn", "--count", "2", "--turns", "30", "--small-instances", "0"]
    assert families.main([*argv, "--no-reference", "--jobs", "1", "--write", str(report)]) == 0
    text = report.read_text(encoding="utf-8")
    assert "### multi-turn: every workload" in text and "### Small batch instances" not in text


SMALL_SOAK = ["--calls", "600", "--windows", "6", "--warmup", "0.5", "--active", "10"]
SMALL_SOAK += ["--max-conversations", "40"]  # full within the warm-up: ~6 turns each


def _run_small_soak(tmp_path: Path, *stores_and_url: str) -> tuple[str, list[dict[str, Any]]]:
    report, raw = tmp_path / "bench.md", tmp_path / "soak.json"
    report.write_text("# Benchmarks\n\nprose kept\n", encoding="utf-8")
    argv = [*SMALL_SOAK, *stores_and_url, "--write", str(report), "--json", str(raw)]
    assert soak.main([*argv, "--plot", str(tmp_path / "img" / "soak.png")]) == 0
    assert (tmp_path / "img" / "soak.png").stat().st_size > 0
    return report.read_text(encoding="utf-8"), json.loads(raw.read_text(encoding="utf-8"))


def _check_soak_windows(result: dict[str, Any]) -> None:
    windows, bounds = result["windows"], result["bounds"]
    assert [w["calls"] for w in windows] == [100, 200, 300, 400, 500, 600]
    assert result["warmup_calls"] == 300
    for window in windows:
        assert 0 < window["p50_ms"] <= window["p99_ms"]
        assert 0 < window["conversations"] <= bounds["max_conversations"]
        assert 0 < window["max_tenant_tokens"] <= bounds["tenant_capacity_tokens"]
        assert window["rss_mb"] > 0 and window["history_lost"] == 0
    assert windows[-1]["conversations"] == bounds["max_conversations"] == 40


def test_small_soak_on_memory_writes_its_section_plot_and_windows(tmp_path: Path) -> None:
    text, results = _run_small_soak(tmp_path, "--stores", "memory")
    assert text.startswith("# Benchmarks\n\nprose kept\n")
    assert begin_marker("soak") in text and text.rstrip().endswith(end_marker("soak"))
    assert "- runs: 1;" in text and "![p99 latency and RSS over the soak](img/soak.png)" in text
    assert "| memory: p99, last window / first after warm-up | ≤ 1.5× |" in text
    assert "Redis overhead" not in text
    assert [r["store"] for r in results] == ["memory"]
    _check_soak_windows(results[0])
    assert results[0]["windows"][0]["server_mb"] is None


def test_small_soak_on_redis_reports_the_overhead_over_memory(
    tmp_path: Path, redis_url: str
) -> None:
    text, results = _run_small_soak(tmp_path, "--stores", "memory,redis", "--redis-url", redis_url)
    assert "| redis: conversations and tenant indexes within their bounds |" in text
    assert "| Redis overhead: median optimize after warm-up, Redis minus memory | ≤ 1 ms |" in text
    assert [r["store"] for r in results] == ["memory", "redis"]
    for result in results:
        _check_soak_windows(result)
    assert all(w["server_mb"] > 0 for w in results[1]["windows"])


def _python_files() -> list[Path]:
    return sorted(
        [*(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "contextpilot_rag").rglob("*.py")]
    )


def test_the_engine_suite_writes_one_section_per_engine() -> None:
    def section(*argv: str) -> str:
        parser = argparse.ArgumentParser()
        add_engine_arguments(parser)
        parser.add_argument("--section")
        return engine.section_name(parser.parse_args(list(argv)))

    assert section() == "engine-suite"  # vLLM, the engine
    assert section("--engine", "llama-server") == "engine-suite-llama-server"
    assert section("--endpoint", "http://127.0.0.1:8000", "--model", "m") == "engine-suite-endpoint"
    assert section("--engine", "llama-server", "--section", "mine") == "mine"


def test_no_python_code_is_kept_in_a_string_and_run_with_dash_c() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for path in _python_files()
        if re.search(r"""sys\.executable,\s*["']-c["']""", path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_benchmarks_import_only_public_names_of_the_package() -> None:
    private = []
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            if not node.module.startswith("contextpilot_rag"):
                continue
            names = [node.module, *(alias.name for alias in node.names)]
            if any(part.startswith("_") for name in names for part in name.split(".")):
                private.append(f"{path.relative_to(ROOT)}: from {node.module} import ...")
    assert private == []


def test_batch_headroom_writes_searches_and_widths_within_their_bounds(tmp_path: Path) -> None:
    import batch_headroom

    report = tmp_path / "bench.md"
    image = tmp_path / "img" / "headroom.png"
    argv = ["--draws", "1", "--requests", "120", "--write", str(report), "--plot", str(image)]
    assert batch_headroom.main(argv) == 0
    text = report.read_text(encoding="utf-8")
    assert begin_marker("batch-headroom") in text and "### Other searches against ours" in text
    assert image.stat().st_size > 0
    (result,) = [batch_headroom.measure((1, 120))]
    assert result.requests == 120
    for share in (result.ours, result.longer, result.cover_first):
        assert 0.0 < share <= result.bound + 1e-9  # no plan beats the bound
    assert result.longer >= result.ours - 1e-12  # refining never shares less
    for width in result.widths:
        # the independent set is a packing, the packing bounds every plan's width (ours,
        # and the greedy cover at that depth alone) from below
        assert width.independent <= width.packing + 1e-6
        assert width.packing <= min(width.ours, width.cover) + 1e-6
        assert width.cover <= width.alive and width.ours <= width.alive


@pytest.mark.parametrize(
    "argv", [["--draws", "one"], ["--draws", "-1"], ["--requests", "1"], ["--jobs", "0"]]
)
def test_batch_headroom_refuses_bad_arguments_before_any_work(
    argv: list[str], tmp_path: Path
) -> None:
    import batch_headroom

    report = tmp_path / "bench.md"
    with pytest.raises(SystemExit) as exit_info:
        batch_headroom.main([*argv, "--write", str(report)])
    assert exit_info.value.code == 2
    assert not report.exists()
