"""llama.cpp's ``llama-server``, built from the sources vendored in the
``llama-cpp-python`` sdist (~7 min on 2 cores) into ``<home>/llama.cpp/bin``.

``LLAMA_USE_PREBUILT_UI`` stays off: it would download a web UI.
"""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

from ._commands import StepOutcome, run_logged
from ._model_fetch import ensure_tools_venv
from ._stamps import read_stamp, write_stamp
from .errors import EngineInstallError
from .home import EngineLayout

__all__ = ["LLAMA_CPP_PYTHON_VERSION", "ensure_llama_server"]

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
_CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
)


def _check_toolchain() -> None:
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        raise EngineInstallError(
            f"building llama-server needs {' and '.join(missing)} on PATH "
            "(e.g. apt-get install cmake g++)"
        )


def _sources(layout: EngineLayout, log: Path) -> Path:
    """The vendored llama.cpp tree, downloaded and unpacked once."""
    src = layout.llama_dir / "src"
    name = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
    tree = src / name
    if not (tree / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        src.mkdir(parents=True, exist_ok=True)
        python = ensure_tools_venv(layout, log)
        requirement = f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
        download = [python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        run_logged([*download, requirement, "-d", src], log_path=log, what="pip download")
        with tarfile.open(src / f"{name}.tar.gz") as archive:
            if hasattr(tarfile, "data_filter"):
                archive.extractall(src, filter="data")
            else:  # Python < 3.10.12 / 3.11.4: no extraction filters
                archive.extractall(src)
    return tree / "vendor" / "llama.cpp"


def ensure_llama_server(layout: EngineLayout, log: Path) -> StepOutcome:
    """Build llama-server unless a stamped binary is there (``"skipped"``)."""
    binary = layout.llama_server
    if read_stamp(layout.stamp("llama-server")) is not None and os.access(binary, os.X_OK):
        return "skipped"
    _check_toolchain()
    source = _sources(layout, log)
    build = layout.llama_dir / "build"
    configure = ["cmake", "-S", source, "-B", build, *_CMAKE_FLAGS]
    run_logged(configure, log_path=log, what="cmake configure")
    jobs = str(os.cpu_count() or 1)
    compile_ = ["cmake", "--build", build, "--target", "llama-server", "-j", jobs]
    run_logged(compile_, log_path=log, what="building llama-server")
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name("llama-server.partial")
    shutil.copy2(build / "bin" / "llama-server", partial)
    partial.replace(binary)
    version = f"llama.cpp from llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}"
    write_stamp(
        layout.stamp("llama-server"),
        kind="llama-server",
        version=version,
        size_bytes=binary.stat().st_size,
    )
    return "done"
