"""Engines left running by ``contextpilot-rag engine start``: one JSON record each in
``<home>/run/<kind>-<port>.json``.

A record names its process by pid *and* start time (``/proc/PID/stat``), and its
process group. ``engine stop`` signals a recorded group only while its leader is
still that very process: a record whose pid has died, or been reused by another
process, is stale and removed without signalling anything; so is a record that does
not name its process completely (a hand-edited ``"start_ticks": null``).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .processes import is_running, process_info, terminate_group
from .running import RunningEngine

__all__ = ["RunRecord", "StopOutcome", "detach_engine", "read_records", "stop_recorded"]


@dataclass(frozen=True)
class RunRecord:
    """A detached engine. ``pid``: its watchdog, leader of process group ``pgid``;
    ``start_ticks``: the watchdog's start time in clock ticks since boot."""

    kind: str
    model_name: str
    port: int
    base_url: str
    pid: int
    pgid: int
    start_ticks: int
    command: tuple[str, ...]
    log_path: str
    started_at: float  # Unix time
    block_size: int | None = None
    kv_cache_tokens: int | None = None

    @property
    def file_name(self) -> str:
        return f"{self.kind}-{self.port}.json"

    def is_running(self) -> bool:
        """Whether the recorded watchdog is still alive, the same process, and still
        leads the recorded group. A record without a pid, group and start time to
        check (hand-edited: ``null``, text) names no process: it is stale."""
        if not (_integer(self.pid, 1) and _integer(self.pgid, 1) and _integer(self.start_ticks, 0)):
            return False
        info = process_info(self.pid)
        same = is_running(self.pid, self.start_ticks) and info is not None
        return same and info is not None and info.pgid == self.pgid == self.pid

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        data = json.loads(text)
        data["command"] = tuple(data["command"])
        return cls(**data)


def _integer(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def detach_engine(engine: RunningEngine, run_dir: Path) -> RunRecord:
    """Record ``engine`` in ``run_dir`` and let it outlive this process."""
    info = process_info(engine.pid)
    if info is None or not info.alive:
        raise ProcessLookupError(f"engine watchdog {engine.pid} is not running")
    record = RunRecord(
        kind=engine.kind,
        model_name=engine.model_name,
        port=engine.port,
        base_url=engine.base_url,
        pid=engine.pid,
        pgid=info.pgid,
        start_ticks=info.start_ticks,
        command=engine.command,
        log_path=str(engine.log_path),
        started_at=time.time(),
        block_size=engine.block_size,
        kv_cache_tokens=engine.kv_cache_tokens,
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    partial = run_dir / (record.file_name + ".partial")
    partial.write_text(json.dumps(asdict(record), indent=2) + "\n")
    os.replace(partial, run_dir / record.file_name)
    engine.detach()
    return record


def read_records(run_dir: Path) -> list[tuple[Path, RunRecord | None]]:
    """Every record file in ``run_dir`` with its record (``None``: unreadable)."""
    records: list[tuple[Path, RunRecord | None]] = []
    for path in sorted(run_dir.glob("*.json")) if run_dir.is_dir() else []:
        try:
            records.append((path, RunRecord.from_json(path.read_text())))
        except (OSError, ValueError, TypeError, KeyError):
            records.append((path, None))
    return records


@dataclass(frozen=True)
class StopOutcome:
    """What ``stop_recorded`` did with one record file: ``"stopped"`` the engine, or
    removed a ``"stale"`` / ``"unreadable"`` record without signalling anything."""

    path: Path
    record: RunRecord | None
    action: str


def stop_recorded(
    run_dir: Path, *, port: int | None = None, grace_s: float = 20.0
) -> list[StopOutcome]:
    """Stop the recorded engines (those on ``port`` only, if given) and remove their
    records."""
    outcomes = []
    for path, record in read_records(run_dir):
        if port is not None and (record is None or record.port != port):
            continue
        if record is None:
            action = "unreadable"
        elif record.is_running():
            result = terminate_group(
                record.pgid, leader_start_ticks=record.start_ticks, grace_s=grace_s
            )
            action = "stale" if result == "not ours" else "stopped"
        else:
            action = "stale"
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        outcomes.append(StopOutcome(path, record, action))
    return outcomes
