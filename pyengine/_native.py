"""The cffi (ABI mode) binding of native/include/pyengine.h.

The cdef is the header's own text between its cffi-begin and cffi-end markers, so the binding
cannot drift from the library it loads; a library of another API version is refused.
"""

from __future__ import annotations

import os
import re
import sys
import threading

import cffi

from .errors import CapacityError, EngineError

_HERE = os.path.dirname(os.path.abspath(__file__))
_HEADER_CANDIDATES = (
    os.path.join(_HERE, "include", "pyengine.h"),  # installed copy
    os.path.join(_HERE, "..", "native", "include", "pyengine.h"),  # source tree
)
_LIBRARY_NAME = "libpyengine.so"

# PE_ERR_* -> exception class; messages come from pe_last_error().
_STATUS_NAMES = {
    -1: "invalid argument",
    -2: "not found",
    -3: "out of memory",
    -4: "unsupported",
    -5: "wrong state",
    -6: "internal error",
}


def header_path() -> str:
    for path in _HEADER_CANDIDATES:
        if os.path.exists(path):
            return os.path.normpath(path)
    raise EngineError(f"pyengine.h not found (looked in {', '.join(_HEADER_CANDIDATES)})")


def cdef_source(header_text: str) -> str:
    """The part of the header cffi parses."""
    match = re.search(r"/\* cffi-begin \*/(.*?)/\* cffi-end \*/", header_text, re.S)
    if not match:
        raise EngineError("pyengine.h has no cffi-begin / cffi-end section")
    return match.group(1)


def library_path() -> str:
    override = os.environ.get("PYENGINE_LIBRARY")
    if override:
        return override
    here = os.path.join(_HERE, _LIBRARY_NAME)
    if os.path.exists(here):
        return here
    # Imported from a source checkout (python run in the repo root): use the installed build,
    # if any; the API version check below refuses one that does not match this header.
    for entry in sys.path:
        candidate = os.path.join(entry or ".", "pyengine", _LIBRARY_NAME)
        if os.path.exists(candidate):
            return candidate
    return here


class Native:
    """The loaded library: `ffi`, `lib`, and `check(status)` raising on errors."""

    def __init__(self) -> None:
        with open(header_path(), encoding="utf-8") as f:
            header = f.read()
        self.ffi = cffi.FFI()
        self.ffi.cdef(cdef_source(header))
        path = library_path()
        if not os.path.exists(path):
            raise EngineError(f"native library not found at {path}: reinstall pyengine (pip install .)")
        self.lib = self.ffi.dlopen(path)
        expected = int(re.search(r"#define PE_API_VERSION (\d+)", header).group(1))
        got = self.lib.pe_api_version()
        if got != expected:
            raise EngineError(
                f"native library {path} has API version {got}, this pyengine needs {expected}"
            )
        self.build_info = self.ffi.string(self.lib.pe_build_info()).decode()

    def last_error(self) -> str:
        return self.ffi.string(self.lib.pe_last_error()).decode("utf-8", "replace")

    def check(self, status: int, what: str = "") -> None:
        if status == 0:
            return
        message = self.last_error() or _STATUS_NAMES.get(status, f"status {status}")
        if status == -1:
            raise ValueError(message)
        if status == -3:
            raise CapacityError(message)
        raise EngineError(f"{what + ': ' if what else ''}{message}", status=status)


_native: Native | None = None
_lock = threading.Lock()


def native() -> Native:
    """The process-wide binding, loaded on first use."""
    global _native
    with _lock:
        if _native is None:
            _native = Native()
        return _native


def cuda_available() -> bool:
    """True when this build has the CUDA backend and a GPU is usable (device="auto" picks it)."""
    n = native()
    return bool(n.lib.pe_device_available(b"cuda"))
