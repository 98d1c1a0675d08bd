"""Starting an installed engine: the command line and environment for each kind,
checked before anything starts, then :func:`~.launch.launch_engine`.

Engines are offline (``HF_HUB_OFFLINE=1``), on ``127.0.0.1`` only, and log to
``<home>/logs/<kind>-<port>.log``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError
from .errors import EngineNotInstalledError
from .install import InstalledEngine, installed_engine
from .launch import LaunchSpec, check_loopback, free_port, launch_engine, normalise_extra_args
from .memory import GIB, VLLM_FOOTPRINT_GIB, available_memory_bytes
from .models import EngineKind, ModelSpec, check_engine_kind, model_spec
from .running import KVEventPorts, RunningEngine

__all__ = [
    "default_vllm_dtype",
    "llama_server_launch_spec",
    "start_engine",
    "usable_cpus",
    "vllm_launch_spec",
]

VLLM_DTYPES = ("bfloat16", "float32")
_CPU_LIST = re.compile(r"^[0-9]+([,-][0-9]+)*\Z")
_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")

_VLLM_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
}


def _kv_events_flag(kv_events: KVEventPorts) -> tuple[str, ...]:
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": kv_events.publisher_endpoint,
        "replay_endpoint": kv_events.replay_endpoint,
        "topic": kv_events.topic,
    }
    return ("--kv-events-config", json.dumps(config))


def default_vllm_dtype(cpuinfo: str | None = None) -> str:
    """``"bfloat16"`` where the CPU computes it natively (AVX512-BF16 or AMX), else
    ``"float32"``: on an AVX2-only CPU, bf16 matmuls fall back to a slow path (measured
    here: 2.5k-token prefill 75-83 s in bf16, 19-22 s in fp32). fp32 halves the tokens
    a given ``kv_cache_gib`` holds. ``cpuinfo``: ``/proc/cpuinfo``'s text (read if None)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "bfloat16"
    flags = set(cpuinfo.split())
    return "bfloat16" if any(flag in flags for flag in _BF16_CPU_FLAGS) else "float32"


def vllm_launch_spec(
    installed: InstalledEngine,
    *,
    port: int,
    block_size: int = 32,
    kv_cache_gib: int = 2,
    max_model_len: int = 8192,
    kv_events: KVEventPorts | None = None,
    enforce_eager: bool = False,
    dtype: str | None = None,
    cpu_bind: str = "nobind",
    extra_args: Sequence[str] = (),
    startup_timeout_s: float = 600.0,
) -> LaunchSpec:
    """vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``: ``vllm
    serve`` does not work with the CPU build's distribution) with prefix caching and
    cached-token usage reports. ``enforce_eager`` skips torch.compile (a faster
    start-up, slower serving); ``dtype``: see :func:`default_vllm_dtype` (``None``).
    ``cpu_bind`` (``VLLM_CPU_OMP_THREADS_BIND``): ``"nobind"`` leaves placement to the
    kernel; vLLM's own ``"auto"`` pins the model worker to one core — the same core in
    every instance, so concurrent engines starve one another (seen here: a start-up
    stalled for 10 minutes beside a busy engine) —; or a core list such as ``"1"``."""
    model = installed.model.served_name
    command = (
        str(installed.executable),
        *("-m", "vllm.entrypoints.openai.api_server"),
        *("--model", str(installed.model_path), "--served-model-name", model),
        *("--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len)),
        *("--enable-prefix-caching", "--enable-prompt-tokens-details"),
        *("--block-size", str(block_size), "--dtype", dtype or default_vllm_dtype()),
        *(_kv_events_flag(kv_events) if kv_events is not None else ()),
        *(("--enforce-eager",) if enforce_eager else ()),
        *extra_args,
    )
    return LaunchSpec(
        command=command,
        port=port,
        model_name=model,
        kind="vllm",
        log_path=installed.layout.logs_dir / f"vllm-{port}.log",
        env={
            **_VLLM_ENV,
            "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
            "VLLM_CPU_OMP_THREADS_BIND": cpu_bind,
        },
        block_size=block_size,
        kv_events=kv_events,
        startup_timeout_s=startup_timeout_s,
    )


def usable_cpus() -> str:
    """The cores this process may run on, as a ``cpu_bind`` core list (``"0-1"``,
    ``"0,2-3"``): one engine alone on a machine runs with its model worker's threads
    pinned to all of them: unpinned (``"nobind"``), the threads wander between cores
    and identical requests take widely different times (docs/engines.md)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not cores:
        return f"0-{max(0, (os.cpu_count() or 1) - 1)}"
    runs: list[list[int]] = []
    for core in cores:
        if runs and core == runs[-1][-1] + 1:
            runs[-1].append(core)
        else:
            runs.append([core])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def llama_server_launch_spec(
    installed: InstalledEngine,
    *,
    port: int,
    max_model_len: int = 8192,
    slots: int = 1,
    threads: int | None = None,
    extra_args: Sequence[str] = (),
    startup_timeout_s: float = 600.0,
) -> LaunchSpec:
    """llama-server with ``slots`` slots of ``max_model_len`` tokens each (every slot
    keeps the prefix of its last prompt, reused at token granularity)."""
    context = max_model_len * slots
    spec = installed.model
    command = (
        str(installed.executable),
        *("-m", str(installed.model_path), "-c", str(context), "-np", str(slots)),
        *("-t", str(threads or os.cpu_count() or 1)),
        *("--host", "127.0.0.1", "--port", str(port), "--alias", spec.served_name),
        *(("--swa-full",) if spec.sliding_window else ()),
        *extra_args,
    )
    return LaunchSpec(
        command=command,
        port=port,
        model_name=spec.served_name,
        kind="llama-server",
        log_path=installed.layout.logs_dir / f"llama-server-{port}.log",
        block_size=1,
        kv_cache_tokens=context,
        startup_timeout_s=startup_timeout_s,
    )


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_kv_cache_fits(kv_cache_gib: int, cpu_bind: str) -> None:
    """Refuse a vLLM KV cache that cannot fit in the memory on the NUMA node of the
    engine's cores (vLLM would fail after minutes of start-up); nothing is checked
    where that memory cannot be read."""
    available = available_memory_bytes(cpu_bind)
    if available is None:
        return
    room = available / GIB - VLLM_FOOTPRINT_GIB
    if kv_cache_gib > room:
        cores = f"cores {cpu_bind}" if _CPU_LIST.match(cpu_bind) else "this process's first core"
        raise ConfigError(
            f"kv_cache_gib={kv_cache_gib} does not fit: the memory node of {cores} "
            f"has {available / GIB:.1f} GiB available and vLLM takes about "
            f"{VLLM_FOOTPRINT_GIB:g} GiB of it before allocating its cache; pass a "
            f"kv_cache_gib of at most {max(0, int(room))} (or free memory)"
        )


def _check_arguments(
    kind: EngineKind,
    spec: ModelSpec,
    *,
    host: str,
    port: int | None,
    block_size: int,
    kv_cache_gib: int,
    max_model_len: int,
    kv_events: KVEventPorts | None,
    slots: int,
    threads: int | None,
) -> None:
    check_loopback(host)
    if port is not None and not (_positive_int(port) and port < 65536):
        raise ConfigError(f"port {port!r} is not in 1..65535")
    if kind == "vllm" and not (_positive_int(block_size) and block_size % 32 == 0):
        raise ConfigError(f"block_size {block_size!r}: vLLM's CPU build needs a multiple of 32")
    if not _positive_int(kv_cache_gib):
        raise ConfigError(f"kv_cache_gib {kv_cache_gib!r} must be a whole number of GiB >= 1")
    if not (_positive_int(max_model_len) and 128 <= max_model_len <= spec.context_tokens):
        raise ConfigError(f"max_model_len {max_model_len!r} must be in 128..{spec.context_tokens}")
    if kv_events is not None and kind != "vllm":
        raise ConfigError("KV-cache events are published by vLLM only")
    if kv_events is not None and port in (kv_events.publisher, kv_events.replay):
        raise ConfigError(
            f"port {port} is also a KV event port (publisher {kv_events.publisher}, replay "
            f"{kv_events.replay}): the engine serves HTTP on one port and its events on others"
        )
    if not _positive_int(slots) or not (threads is None or _positive_int(threads)):
        raise ConfigError(f"slots ({slots!r}) and threads ({threads!r}) must be integers >= 1")


def start_engine(
    kind: EngineKind = "vllm",
    model: str = "smollm2",
    *,
    port: int | None = None,
    host: str = "127.0.0.1",
    block_size: int = 32,
    kv_cache_gib: int = 2,
    max_model_len: int | None = None,
    kv_events: KVEventPorts | None = None,
    slots: int = 1,
    threads: int | None = None,
    enforce_eager: bool = False,
    dtype: str | None = None,
    cpu_bind: str = "nobind",
    extra_args: Sequence[str] = (),
    startup_timeout_s: float = 600.0,
    home: Path | None = None,
) -> RunningEngine:
    """Start an installed engine on ``127.0.0.1`` and wait until it serves the model
    (vLLM: minutes, see docs/engines.md). ``port``: a free one if ``None``. vLLM uses
    ``block_size`` (a multiple of 32), ``kv_cache_gib``, ``kv_events``,
    ``enforce_eager`` (no torch.compile: a faster start, slower serving), ``dtype``
    (``None``: float32 on CPUs without native bf16, see :func:`default_vllm_dtype`) and
    ``cpu_bind`` (see :func:`vllm_launch_spec`); llama-server uses ``slots`` and
    ``threads``. ``max_model_len``: tokens per request (default: the
    model's context, at most 8192). Stop it with ``stop()`` or a ``with`` block; it is
    also stopped when this process exits or dies.

    Raises :class:`ConfigError` (bad arguments, a non-loopback ``host``, a vLLM
    ``kv_cache_gib`` that does not fit in the memory of the engine's cores) before
    anything starts, :class:`~.errors.EngineNotInstalledError`,
    :class:`~.errors.EngineStartError`."""
    kind = check_engine_kind(kind)
    spec = model_spec(kind, model)
    length = min(8192, spec.context_tokens) if max_model_len is None else max_model_len
    _check_arguments(
        kind,
        spec,
        host=host,
        port=port,
        block_size=block_size,
        kv_cache_gib=kv_cache_gib,
        max_model_len=length,
        kv_events=kv_events,
        slots=slots,
        threads=threads,
    )
    if dtype is not None and dtype not in VLLM_DTYPES:
        raise ConfigError(f"dtype {dtype!r}: choose one of {', '.join(VLLM_DTYPES)} or None")
    if cpu_bind not in ("auto", "nobind") and not _CPU_LIST.match(str(cpu_bind)):
        raise ConfigError(f"cpu_bind {cpu_bind!r}: 'nobind', 'auto' or cores such as '0-1'")
    extra = normalise_extra_args(extra_args)
    installed = installed_engine(kind, model, home=home)
    if installed is None:
        raise EngineNotInstalledError(
            f"{kind} with {model} is not installed: run "
            f"`contextpilot-rag engine install --engine {kind} --model {model}`"
        )
    chosen = free_port() if port is None else port
    if kind == "vllm":
        _check_kv_cache_fits(kv_cache_gib, cpu_bind)
        launch = vllm_launch_spec(
            installed,
            port=chosen,
            block_size=block_size,
            kv_cache_gib=kv_cache_gib,
            max_model_len=length,
            kv_events=kv_events,
            enforce_eager=enforce_eager,
            dtype=dtype,
            cpu_bind=cpu_bind,
            extra_args=extra,
            startup_timeout_s=startup_timeout_s,
        )
    else:
        launch = llama_server_launch_spec(
            installed,
            port=chosen,
            max_model_len=length,
            slots=slots,
            threads=threads,
            extra_args=extra,
            startup_timeout_s=startup_timeout_s,
        )
    return launch_engine(launch)
