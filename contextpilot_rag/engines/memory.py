"""The memory a CPU engine can take for its KV cache, counted as vLLM's CPU worker
counts it before allocating: what is available on the NUMA node of the first core the
engine runs on (free, file-backed and reclaimable memory), within the container's
memory limit. vLLM refuses to start when its ``VLLM_CPU_KVCACHE_SPACE`` exceeds it,
after minutes of start-up; reading it first lets a caller choose a cache that fits.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["GIB", "VLLM_FOOTPRINT_GIB", "available_memory_bytes"]

GIB = 2**30
VLLM_FOOTPRINT_GIB = 2.0
"""What vLLM's own processes (server, engine core, model worker with SmolLM2's weights)
take on the node before its KV cache is allocated, at least: about 2.4 GiB measured
with SmolLM2-135M in float32 on a 2-core machine, rounded down, so that a cache refused
for it would surely not have fitted."""
_NODE_FIELDS = ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable")


def available_memory_bytes(cpu_bind: str = "nobind", *, root: Path = Path("/")) -> int | None:
    """Bytes an engine whose threads run on ``cpu_bind`` (a core list such as
    ``"0-1"``, or ``"nobind"``/``"auto"``: this process's first usable core) can
    allocate: its core's NUMA node's free, file-backed and reclaimable memory (the
    whole machine's ``MemAvailable`` where the kernel shows no nodes), at most what
    the cgroup's memory limit leaves. ``None`` when none of it can be read.
    ``root``: where ``/sys`` and ``/proc`` are (tests)."""
    node = _node_of(_first_core(cpu_bind), root)
    available = None if node is None else _node_available(node)
    if available is None:
        available = _meminfo_field(root / "proc" / "meminfo", "MemAvailable")
    left = _cgroup_left(root)
    if left is None:
        return available
    return left if available is None else min(available, left)


def _first_core(cpu_bind: str) -> int:
    first = cpu_bind.split(",")[0].split("-")[0]
    if first.isdigit():
        return int(first)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return cores[0] if cores else 0


def _node_of(core: int, root: Path) -> Path | None:
    """The meminfo of the NUMA node holding ``core``."""
    cpu = root / "sys" / "devices" / "system" / "cpu" / f"cpu{core}"
    try:
        links = sorted(entry.name for entry in cpu.iterdir() if entry.name.startswith("node"))
    except OSError:
        return None
    for name in links:
        if name[4:].isdigit():
            return root / "sys" / "devices" / "system" / "node" / name / "meminfo"
    return None


def _node_available(meminfo: Path) -> int | None:
    values = [_meminfo_field(meminfo, field) for field in _NODE_FIELDS]
    if any(value is None for value in values):
        return None
    return sum(value for value in values if value is not None)


def _meminfo_field(path: Path, field: str) -> int | None:
    """A ``kB`` field of a meminfo file (``Node 0 MemFree: 123 kB`` or
    ``MemAvailable: 123 kB``), in bytes."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        words = line.split()
        for position, word in enumerate(words[:-1]):
            if word == f"{field}:" and words[position + 1].isdigit():
                return int(words[position + 1]) * 1024
    return None


def _cgroup_left(root: Path) -> int | None:
    """The memory the cgroup's limit leaves (v2 ``memory.max`` less ``memory.current``,
    or v1's ``limit_in_bytes`` less ``usage_in_bytes``); ``None`` without a limit."""
    cgroup = root / "sys" / "fs" / "cgroup"
    for limit_file, usage_file in (
        (cgroup / "memory.max", cgroup / "memory.current"),
        (cgroup / "memory" / "memory.limit_in_bytes", cgroup / "memory" / "memory.usage_in_bytes"),
    ):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        # v1 reports "no limit" as a huge number: anything over an exabyte is none
        if limit is not None and limit < 2**60:
            return max(0, limit - (usage or 0))
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
