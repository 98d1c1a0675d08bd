"""Run the reference ``contextpilot`` 0.5.0 *batch mode* on block codes, in a child process.

Batch mode is ``ContextPilot.build_and_schedule`` (what the reference's ``reorder`` and
``optimize_batch`` run on a fresh index): pairwise distances, average-linkage
clustering, intra-context reordering along the tree, inter-context scheduling by search
path, and the live metadata that makes the index searchable afterwards.

The reference runs in a fresh interpreter so that its peak memory is its own, a run past
``timeout_s`` can be killed (with the ``multiprocessing`` workers it forks), and its
prints go nowhere. The child is this file run as a script in isolated mode
(``python -I``: neither this directory nor the environment's ``PYTHON*`` settings on
its path), so it imports only the standard library and the reference.

How the reference treats its input (0.5.0):

* A context is a *set*: contexts with the same set of blocks share one leaf and are all
  sent in the order of the first of them; they get adjacent slots in the schedule.
* A code repeated inside one context is dropped from the order it sends, so repeated
  codes are rejected here (``ValueError``).
* Empty contexts stay empty and are scheduled together, as one group.
* Codes go into ``int32`` arrays, so each code is replaced by its rank among all codes
  before the run. The reference uses codes only through equality and sorting, so an
  order-preserving renaming does not change what it does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

__all__ = ["REFERENCE_ALPHA", "ReferenceBatchResult", "run_reference_batch"]

logger = logging.getLogger(__name__)

REFERENCE_ALPHA = 0.001
"""The position weight of the reference's distance (its default and the paper's)."""

_INPUT_NAME = "contexts.json"
_OUTPUT_NAME = "result.json"
_STDERR_NAME = "stderr.txt"


@dataclass(frozen=True)
class ReferenceBatchResult:
    """What the reference's batch mode decided for a list of contexts."""

    orders: tuple[tuple[int, ...], ...]  # per input index: its codes in the order sent
    schedule: tuple[int, ...]  # input indices in execution order
    seconds: float  # wall time of build + reorder + schedule inside the child
    peak_rss_mb: float  # peak resident memory of the child (its forked workers excluded)


def run_reference_batch(
    contexts: Sequence[Sequence[int]], *, timeout_s: float = 600.0
) -> ReferenceBatchResult | None:
    """Run the reference batch mode (CPU, ``alpha=REFERENCE_ALPHA``) on ``contexts``, each
    a sequence of distinct int block codes.

    Returns ``None``, with a warning logged, when the reference is not installed, runs
    past ``timeout_s`` or fails. Raises ``ValueError`` if a context repeats a code and
    ``AssertionError`` if the reference's answer is not a permutation of the input."""
    requests = [tuple(context) for context in contexts]
    _check_distinct_codes(requests)
    if find_spec("contextpilot") is None:
        logger.warning("reference batch skipped: contextpilot is not installed")
        return None
    codes = sorted({code for request in requests for code in request})
    rank_of = {code: rank for rank, code in enumerate(codes)}
    ranked = [[rank_of[code] for code in request] for request in requests]
    with tempfile.TemporaryDirectory(prefix="contextpilot-reference-") as workdir:
        answer = _run_child(Path(workdir), ranked, timeout_s)
    if answer is None:
        return None
    result = _decode_answer(answer, codes)
    _check_result(result, requests)
    return result


def _check_result(result: ReferenceBatchResult, contexts: Sequence[Sequence[int]]) -> None:
    """Raise ``AssertionError`` unless every ``result.orders[i]`` is a permutation of
    ``contexts[i]`` and ``result.schedule`` is a permutation of ``range(len(contexts))``."""
    assert len(result.orders) == len(contexts), (
        f"reference returned {len(result.orders)} orders for {len(contexts)} contexts"
    )
    for index, (order, context) in enumerate(zip(result.orders, contexts, strict=True)):
        assert sorted(order) == sorted(context), (
            f"reference order for context {index} is {list(order)}, "
            f"not a permutation of {list(context)}"
        )
    assert sorted(result.schedule) == list(range(len(contexts))), (
        f"reference schedule is not a permutation of range({len(contexts)})"
    )


def _check_distinct_codes(requests: Sequence[Sequence[int]]) -> None:
    for index, request in enumerate(requests):
        if len(set(request)) != len(request):
            raise ValueError(
                f"context {index} repeats a block code ({list(request)}); the reference "
                "treats a context as a set, so pass each block once"
            )


def _decode_answer(answer: dict[str, Any], codes: Sequence[int]) -> ReferenceBatchResult:
    """Undo the ranking and index the scheduled orders by input position."""
    schedule = tuple(int(index) for index in answer["schedule"])
    scheduled_orders = answer["scheduled_orders"]
    assert sorted(schedule) == list(range(len(schedule))), (
        "reference schedule is not a permutation of the input indices"
    )
    assert len(scheduled_orders) == len(schedule), (
        f"reference sent {len(scheduled_orders)} contexts for {len(schedule)} slots"
    )
    orders: list[tuple[int, ...]] = [()] * len(schedule)
    for index, order in zip(schedule, scheduled_orders, strict=True):
        orders[index] = tuple(codes[rank] for rank in order)
    return ReferenceBatchResult(
        orders=tuple(orders),
        schedule=schedule,
        seconds=float(answer["seconds"]),
        peak_rss_mb=float(answer["peak_rss_kib"]) / 1024.0,
    )


def _run_child(workdir: Path, contexts: list[list[int]], timeout_s: float) -> dict[str, Any] | None:
    """Run the reference on ``contexts`` in a fresh interpreter; its JSON answer, or
    ``None`` (logged) when it timed out or failed."""
    (workdir / _INPUT_NAME).write_text(json.dumps({"contexts": contexts}), encoding="utf-8")
    command = [sys.executable, "-I", str(Path(__file__).resolve()), str(workdir)]
    with (workdir / _STDERR_NAME).open("wb") as stderr:
        child = subprocess.Popen(
            command,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # its own process group: a kill reaches its workers
        )
        try:
            returncode = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("reference batch timed out after %g s; killed", timeout_s)
            return None
        finally:
            if child.poll() is None:  # timed out, or interrupted while waiting
                _kill_group(child)
    return _read_answer(workdir, returncode)


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    """Kill the child's process group: the child and the pool workers it forked."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def _read_answer(workdir: Path, returncode: int) -> dict[str, Any] | None:
    output = workdir / _OUTPUT_NAME
    answer: dict[str, Any] = (
        json.loads(output.read_text(encoding="utf-8")) if output.exists() else {}
    )
    if returncode == 0 and "error" not in answer and answer:
        return answer
    reason = answer.get("error") or _last_line(workdir / _STDERR_NAME)
    if returncode < 0:
        reason = f"killed by {signal.Signals(-returncode).name}; {reason}"
    logger.warning("reference batch failed (exit status %d): %s", returncode, reason)
    return None


def _last_line(path: Path) -> str:
    lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    return lines[-1] if lines else "no error output"


def _child_main(workdir: Path) -> None:
    """In the child: run the reference on the input file and write the answer file."""
    contexts = json.loads((workdir / _INPUT_NAME).read_text(encoding="utf-8"))["contexts"]
    try:
        answer = _run_reference(contexts)
    except Exception as error:  # any failure of the reference is reported, not raised
        answer = {"error": f"{type(error).__name__}: {error}"}
    (workdir / _OUTPUT_NAME).write_text(json.dumps(answer), encoding="utf-8")


def _run_reference(contexts: list[list[int]]) -> dict[str, Any]:
    from contextpilot.server.live_index import ContextPilot

    reference: Any = ContextPilot(alpha=REFERENCE_ALPHA, use_gpu=False)
    started = time.perf_counter()
    scheduled = reference.build_and_schedule(contexts)
    seconds = time.perf_counter() - started
    return {
        "scheduled_orders": [list(order) for order in scheduled["reordered_contexts"]],
        "schedule": list(scheduled["original_indices"]),
        "seconds": seconds,
        "peak_rss_kib": _peak_rss_kib(),
    }


def _peak_rss_kib() -> int:
    """This process's peak resident memory. ``VmHWM`` belongs to the address space
    created by ``exec``; ``ru_maxrss`` would also count the forking parent's memory."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


if __name__ == "__main__":
    _child_main(Path(sys.argv[1]))
