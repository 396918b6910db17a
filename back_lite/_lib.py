"""ctypes binding of libbacklite (include/backlite.h).

The library is searched in this order:
  1. the file named by the environment variable BACK_LITE_LIBRARY (a path to the .so);
  2. the back_lite package directory (where `pip install .` puts it);
  3. the installed back-lite distribution's copy, for when the source tree's back_lite/ (which has
     no library) shadows the installed package -- `python -m back_lite.demo` run in the repo root.
A missing library, or one whose bl_abi_version() differs from ABI_VERSION, raises
BackLiteLibraryError (an ImportError) that says what was looked for and how to build it.

This module holds no attention math: it mirrors the C structs, declares the C signatures and turns
a non-OK bl_status into a Python exception.
"""
from __future__ import annotations

import ctypes
import os
import sys
from importlib import metadata

# The ABI this binding was written for; must equal BL_ABI_VERSION in include/backlite.h.
ABI_VERSION = 2

# bl_status (include/backlite.h)
BL_OK = 0
BL_ERR_INVALID_ARGUMENT = 1
BL_ERR_UNSUPPORTED = 2
BL_ERR_NO_BACKEND = 3
BL_ERR_WORKSPACE = 4
BL_ERR_OUT_OF_MEMORY = 5
BL_ERR_CUDA = 6
BL_ERR_INTERNAL = 7
BL_ERR_NOT_DETERMINISTIC = 8

# bl_dtype
BL_DTYPE_F32 = 0
BL_DTYPE_F16 = 1
BL_DTYPE_BF16 = 2

# bl_backend
BL_BACKEND_CPU = 0
BL_BACKEND_CUDA = 1

# Largest head dim of the API (BL_MAX_HEAD_DIM in include/backlite.h)
BL_MAX_HEAD_DIM = 256

# bl_op
BL_OP_FORWARD = 0
BL_OP_BACKWARD = 1

_ENV_VAR = "BACK_LITE_LIBRARY"
_LIB_NAMES = {"darwin": "libbacklite.dylib", "win32": "backlite.dll"}
LIB_NAME = _LIB_NAMES.get(sys.platform, "libbacklite.so")

_BUILD_HINT = (
    "Build and install it with `pip install .` from the BackLite source tree, or build it with "
    "`cmake -S . -B build && cmake --build build` and point the environment variable "
    f"{_ENV_VAR} at build/{LIB_NAME}."
)


class BackLiteLibraryError(ImportError):
    """The C library could not be found or loaded, or it is of another ABI version."""


class BlAttnDesc(ctypes.Structure):
    """Mirror of `bl_attn_desc`; field order and types follow include/backlite.h exactly."""

    _fields_ = [
        ("backend", ctypes.c_int),  # bl_backend (a C enum is an int)
        ("dtype", ctypes.c_int),  # bl_dtype
        ("batch", ctypes.c_int64),
        ("seqlen_q", ctypes.c_int64),
        ("seqlen_k", ctypes.c_int64),
        ("heads_q", ctypes.c_int64),
        ("heads_k", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("scale", ctypes.c_float),
        ("causal", ctypes.c_int),
        ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("deterministic", ctypes.c_int),
    ]


class BlTensor(ctypes.Structure):
    """Mirror of `bl_tensor`: a (B, S, H, D) view with D contiguous, strides in elements."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("stride_b", ctypes.c_int64),
        ("stride_s", ctypes.c_int64),
        ("stride_h", ctypes.c_int64),
    ]


_P_DESC = ctypes.POINTER(BlAttnDesc)
_STATUS = ctypes.c_int

# name -> (restype, argtypes)
_SIGNATURES = {
    "bl_version_string": (ctypes.c_char_p, []),
    "bl_abi_version": (ctypes.c_int, []),
    "bl_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "bl_last_error": (ctypes.c_char_p, []),
    "bl_backend_available": (ctypes.c_int, [ctypes.c_int]),
    # backend, dtype, head_dim
    "bl_supports": (_STATUS, [ctypes.c_int, ctypes.c_int, ctypes.c_int64]),
    "bl_tile_shape": (_STATUS, [ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                ctypes.POINTER(ctypes.c_int)]),
    "bl_num_tiles": (_STATUS, [_P_DESC, ctypes.POINTER(ctypes.c_int64),
                               ctypes.POINTER(ctypes.c_int64)]),
    "bl_workspace_size": (_STATUS, [_P_DESC, ctypes.c_int, ctypes.c_int,
                                    ctypes.POINTER(ctypes.c_size_t)]),
    # device -> 1 where bl_workspace_alloc maps compressible memory (workspace_pool.py)
    "bl_workspace_compressible": (ctypes.c_int, [ctypes.c_int]),
    # desc, q, k, v, out, lse, tile_mass
    "bl_forward": (_STATUS, [_P_DESC, BlTensor, BlTensor, BlTensor, BlTensor,
                             ctypes.c_void_p, ctypes.c_void_p]),
    # desc, tile_mass, negl_prob, mask
    "bl_select_tiles": (_STATUS, [_P_DESC, ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p]),
    # desc, q, k, v, out, dout, lse, tile_mass, negl_prob, mask, dq, dk, dv
    "bl_backward": (_STATUS, [_P_DESC, BlTensor, BlTensor, BlTensor, BlTensor, BlTensor,
                              ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p,
                              BlTensor, BlTensor, BlTensor]),
}


def _candidates() -> list[tuple[str, str]]:
    """(where it came from, path) in search order."""
    found = []
    env = os.environ.get(_ENV_VAR)
    if env:
        found.append((f"${_ENV_VAR}", env))
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIB_NAME)
    found.append(("the back_lite package directory", here))
    try:
        installed = str(metadata.distribution("back-lite").locate_file(f"back_lite/{LIB_NAME}"))
    except metadata.PackageNotFoundError:
        installed = None
    if installed and os.path.abspath(installed) != here:
        found.append(("the installed back-lite distribution", installed))
    return found


def _load() -> tuple[ctypes.CDLL, str]:
    tried = []
    for origin, path in _candidates():
        if not os.path.isfile(path):
            tried.append(f"{path} ({origin}): no such file")
            if origin.startswith("$"):
                # An explicit path that is wrong is an error, not a reason to fall back silently.
                break
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            raise BackLiteLibraryError(
                f"BackLite: found {path} ({origin}) but could not load it: {exc}. {_BUILD_HINT}"
            ) from exc
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError as exc:
                raise BackLiteLibraryError(
                    f"BackLite: {path} ({origin}) lacks the symbol {name}; it is not a "
                    f"BackLite library of ABI {ABI_VERSION}. {_BUILD_HINT}"
                ) from exc
            fn.restype = restype
            fn.argtypes = argtypes
        abi = lib.bl_abi_version()
        if abi != ABI_VERSION:
            raise BackLiteLibraryError(
                f"BackLite: {path} ({origin}) has ABI version {abi}, but this Python package "
                f"needs ABI version {ABI_VERSION}; rebuild the library from the same source "
                f"tree. {_BUILD_HINT}"
            )
        return lib, path
    raise BackLiteLibraryError(
        "BackLite: the C library was not found. Looked for: " + "; ".join(tried) + ". "
        + _BUILD_HINT
    )


lib, path = _load()


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", errors="replace") if raw else ""


def status_string(status: int) -> str:
    return _text(lib.bl_status_string(status))


def last_error() -> str:
    return _text(lib.bl_last_error())


def check(status: int, what: str) -> None:
    """Raises the Python exception for a non-OK bl_status returned by the C call `what`.

    The message carries bl_status_string and bl_last_error (which names the bad argument).
    Must be called on the thread that made the C call (the last error is thread-local)."""
    if status == BL_OK:
        return
    message = f"{what}: {status_string(status)}: {last_error()}"
    if status == BL_ERR_INVALID_ARGUMENT:
        raise ValueError(message)
    if status == BL_ERR_UNSUPPORTED:
        raise NotImplementedError(message)
    if status == BL_ERR_OUT_OF_MEMORY:
        raise MemoryError(message)
    raise RuntimeError(message)


def version_string() -> str:
    return _text(lib.bl_version_string())


def backend_available(backend: int) -> bool:
    return bool(lib.bl_backend_available(backend))


def _query_tile_shape(backend: int) -> tuple[int, int]:
    tm, tn = ctypes.c_int(0), ctypes.c_int(0)
    check(lib.bl_tile_shape(backend, ctypes.byref(tm), ctypes.byref(tn)), "bl_tile_shape")
    return tm.value, tn.value


# Queried once at import: the tile shape is fixed per backend, and torch.compile cannot trace
# a ctypes call while it computes the shapes of fake tensors.
_TILE_SHAPES = {backend: _query_tile_shape(backend)
                for backend in (BL_BACKEND_CPU, BL_BACKEND_CUDA)}


def tile_shape(backend: int) -> tuple[int, int]:
    """(TM, TN) of a backend (bl_tile_shape)."""
    return _TILE_SHAPES[backend]


def _query_support(backend: int, dtype: int, head_dim: int) -> str | None:
    status = lib.bl_supports(backend, dtype, head_dim)
    return None if status == BL_OK else last_error()  # "bl_supports: <the reason>"


# Queried once at import, like the tile shapes (so that code torch.compile traces can ask): for
# every backend, dtype and valid head dim, None where the backend computes it, else the library's
# reason. Cheap: 768 calls that only compare numbers.
_SUPPORT = {(backend, dtype, head_dim): _query_support(backend, dtype, head_dim)
            for backend in (BL_BACKEND_CPU, BL_BACKEND_CUDA)
            for dtype in (BL_DTYPE_F32, BL_DTYPE_F16, BL_DTYPE_BF16)
            for head_dim in range(2, BL_MAX_HEAD_DIM + 1, 2)}


def unsupported_reason(backend: int, dtype: int, head_dim: int) -> str | None:
    """None if `backend` computes attention in `dtype` at `head_dim` (bl_supports), else why not.
    Says nothing about whether the backend is usable on this machine (backend_available)."""
    key = (backend, dtype, head_dim)
    if key in _SUPPORT:
        return _SUPPORT[key]
    return _query_support(backend, dtype, head_dim)  # a value no backend takes: the library's words


def workspace_size(desc: BlAttnDesc, op: int, with_stats: bool) -> int:
    nbytes = ctypes.c_size_t(0)
    check(lib.bl_workspace_size(ctypes.byref(desc), op, int(with_stats), ctypes.byref(nbytes)),
          "bl_workspace_size")
    return nbytes.value
