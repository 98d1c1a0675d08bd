"""llama.cpp's ``llama-server``, built from the sources vendored in the
``llama-cpp-python`` sdist (~7 min on 2 cores) into ``<home>/llama.cpp/bin``.

``LLAMA_USE_PREBUILT_UI`` stays off: it would download a web UI.

On x86-64 the instruction sets are named from ``/proc/cpuinfo`` (:func:`cpu_flags`)
instead of ``GGML_NATIVE``: ``-march=native`` turns on AMX wherever the CPU advertises
it, and some virtual machines advertise AMX (and grant the kernel permission for it)
yet fault on its tile instructions, so the server died with ``SIGILL`` on its first
matrix product. AMX stays off; everything else the CPU lists is used.
"""

from __future__ import annotations

import os
import platform
import shutil
import tarfile
from collections.abc import Sequence
from pathlib import Path

from ._commands import StepOutcome, run_logged
from ._model_fetch import ensure_tools_venv
from ._stamps import read_stamp, write_stamp
from .errors import EngineInstallError
from .home import EngineLayout

__all__ = ["LLAMA_CPP_PYTHON_VERSION", "cpu_flags", "ensure_llama_server"]

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
_CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
)
_BUILD_NAME = "x86-64 named instruction sets, no AMX"  # in the stamp: older builds are redone

# ggml option -> the /proc/cpuinfo flags it needs (all of them)
_X86_OPTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("GGML_SSE42", ("sse4_2",)),
    ("GGML_AVX", ("avx",)),
    ("GGML_AVX2", ("avx2",)),
    ("GGML_FMA", ("fma",)),
    ("GGML_F16C", ("f16c",)),
    ("GGML_BMI2", ("bmi2",)),
    ("GGML_AVX_VNNI", ("avx_vnni",)),
    ("GGML_AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
    ("GGML_AVX512_VBMI", ("avx512vbmi",)),
    ("GGML_AVX512_VNNI", ("avx512_vnni",)),
    ("GGML_AVX512_BF16", ("avx512_bf16",)),
)
_AMX_OPTIONS = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")


def cpu_flags(machine: str, cpuinfo: str) -> tuple[str, ...]:
    """The ggml instruction-set options of the build, for ``machine`` (as
    :func:`platform.machine` names it) with ``cpuinfo`` the text of ``/proc/cpuinfo``
    (empty where there is none): ``GGML_NATIVE`` except on x86-64 where the CPU lists
    its flags; there each option is on exactly when every flag it needs is listed, and
    AMX is off (see the module docstring)."""
    if machine.lower() not in ("x86_64", "amd64"):
        return ("-DGGML_NATIVE=ON",)
    listed: set[str] = set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            listed.update(value.split())
            break
    if not listed:
        return ("-DGGML_NATIVE=ON",)
    options = [
        f"-D{option}={'ON' if all(f in listed for f in needs) else 'OFF'}"
        for option, needs in _X86_OPTIONS
    ]
    return ("-DGGML_NATIVE=OFF", *options, *(f"-D{option}=OFF" for option in _AMX_OPTIONS))


def _this_cpu() -> Sequence[str]:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        cpuinfo = ""
    return cpu_flags(platform.machine(), cpuinfo)


_UNPACKED = ".unpacked"  # written last into a completely unpacked source tree


def _check_toolchain() -> None:
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        raise EngineInstallError(
            f"building llama-server needs {' and '.join(missing)} on PATH "
            "(e.g. apt-get install cmake g++)"
        )


def _sources(layout: EngineLayout, log: Path) -> Path:
    """The vendored llama.cpp tree, downloaded and unpacked once. The archive unpacks
    into a scratch folder renamed into place when complete: an interrupted unpacking
    leaves no tree that looks whole."""
    src = layout.llama_dir / "src"
    name = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
    tree = src / name
    if not (tree / _UNPACKED).is_file():
        src.mkdir(parents=True, exist_ok=True)
        python = ensure_tools_venv(layout, log)
        requirement = f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
        download = [python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        run_logged([*download, requirement, "-d", src], log_path=log, what="pip download")
        scratch = src / f"{name}.partial"
        shutil.rmtree(scratch, ignore_errors=True)
        with tarfile.open(src / f"{name}.tar.gz") as archive:
            if hasattr(tarfile, "data_filter"):
                archive.extractall(scratch, filter="data")
            else:  # Python < 3.10.12 / 3.11.4: no extraction filters
                archive.extractall(scratch)
        (scratch / name / _UNPACKED).touch()
        shutil.rmtree(tree, ignore_errors=True)  # one left by an interrupted older install
        (scratch / name).replace(tree)
        scratch.rmdir()
    return tree / "vendor" / "llama.cpp"


def ensure_llama_server(layout: EngineLayout, log: Path) -> StepOutcome:
    """Build llama-server unless a stamped binary is there (``"skipped"``)."""
    binary = layout.llama_server
    version = f"llama.cpp from llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}, {_BUILD_NAME}"
    stamp = read_stamp(layout.stamp("llama-server"))
    if stamp is not None and stamp.version == version and os.access(binary, os.X_OK):
        return "skipped"
    _check_toolchain()
    source = _sources(layout, log)
    build = layout.llama_dir / "build"
    configure = ["cmake", "-S", source, "-B", build, *_CMAKE_FLAGS, *_this_cpu()]
    run_logged(configure, log_path=log, what="cmake configure")
    jobs = str(os.cpu_count() or 1)
    compile_ = ["cmake", "--build", build, "--target", "llama-server", "-j", jobs]
    run_logged(compile_, log_path=log, what="building llama-server")
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name("llama-server.partial")
    shutil.copy2(build / "bin" / "llama-server", partial)
    partial.replace(binary)
    write_stamp(
        layout.stamp("llama-server"),
        kind="llama-server",
        version=version,
        size_bytes=binary.stat().st_size,
    )
    return "done"
