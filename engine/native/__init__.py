"""The native CPU expert kernels (C, in this folder), loaded with ctypes.

Why ctypes on a plain shared library and not a torch extension: the library then has no ABI tie to
the torch build (the app may swap in a CUDA torch at run time), it compiles in seconds with the
system compiler during `pip install`, and a call costs ~2 us, small next to a layer's expert work.

One binary serves every x86-64 CPU: the C code picks AVX-512 (VNNI, BF16), AVX2 (FMA, F16C) or
portable C from CPUID at load. Where the library is missing or cannot load (no compiler at install,
another architecture without a build), `available()` is False and the engine runs its torch path,
saying so once. Environment: MIXDESK_NATIVE=0 disables it; MIXDESK_KERNEL_PATH=c|avx2|avx512 caps
the code path (tests use it to exercise every path on one machine).
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import logging
import os
import threading
from ctypes import POINTER, c_float, c_int, c_void_p
from pathlib import Path

import torch

log = logging.getLogger(__name__)

F32, F16, BF16, Q4, MX4 = 0, 1, 2, 3, 4
# GGUF block formats (mdk.h): K-quants, then the 32-weight blocks
Q4K, Q5K, Q6K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 = 5, 6, 7, 8, 9, 10, 11, 12
# GGUF's formats read as codes and group scales (codes.c): on the file's own rows only
Q2K, Q3K, IQ4NL, IQ4XS, IQ2XXS, IQ2XS, IQ2S, IQ3XXS, IQ3S, IQ1S, IQ1M, TQ1_0, TQ2_0, NVFP4 = range(14, 28)
ERRORS = {-1: "out of memory for its scratch buffers", -2: "a selected expert is not a native CPU expert",
          -3: "top-k outside 1..experts, or more than 1024 experts"}
PATHS = ("portable C", "AVX2", "AVX-512 VNNI")
FMT = {torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16}
KV8 = 13  # an 8-bit KV cache's rows (engine/kv/int8.py), stored as uint8
KV_FMT = {**FMT, torch.uint8: KV8}  # a KV cache's format in the decode step (mdk_model.kv_fmt), by its dtype


ABI = 8  # mdk_abi() of the library these structs and formats match (cpu.c)


class Matrix(ctypes.Structure):
    """mdk.h's mdk_matrix. raw (GGUF block formats): 0 the kernels' tiles, 1 the file's own rows (n rows
    of k / block ggml blocks), rows r >= n_lo read from w_hi when that is set (gate's and up's rows)."""
    _fields_ = [("fmt", c_int), ("n", c_int), ("k", c_int), ("w", c_void_p), ("d", c_void_p), ("m", c_void_p),
                ("raw", c_int), ("w_hi", c_void_p), ("n_lo", c_int)]


class ExpertDesc(ctypes.Structure):
    _fields_ = [("w13", Matrix), ("w2", Matrix), ("b13", c_void_p), ("b2", c_void_p), ("act", c_int),
                ("alpha", ctypes.c_float), ("limit", ctypes.c_float)]


class Layer(ctypes.Structure):
    _fields_ = [("ln1", c_void_p), ("ln2", c_void_p), ("qkv", Matrix * 3), ("nqkv", c_int), ("wo", Matrix),
                ("experts", c_void_p),
                ("router", Matrix), ("k", c_void_p), ("v", c_void_p), ("q_norm", c_void_p), ("k_norm", c_void_p)]


class Model(ctypes.Structure):
    _fields_ = [("layers", c_int), ("D", c_int), ("H", c_int), ("G", c_int), ("Hd", c_int), ("ctx", c_int),
                ("E", c_int), ("K", c_int), ("window", c_int), ("eps", c_float), ("dtype", c_int),
                ("resid_fmt", c_int), ("norm_fmt", c_int), ("layer", c_void_p), ("norm", c_void_p),
                ("lm_head", Matrix), ("qk_norm", c_int), ("clip", c_float), ("kv_fmt", c_int)]


class _Locked:
    """The library's functions, each call holding one lock: the kernels share scratch buffers and
    one thread pool, so two Python threads must not be inside them at once (the engine thread is
    the one caller in practice; a second caller waits rather than corrupting the first)."""

    def __init__(self, cdll):
        self._cdll = cdll
        self._lock = threading.Lock()

    def __getattr__(self, name):
        fn, lock = getattr(self._cdll, name), self._lock

        def call(*args):
            with lock:
                return fn(*args)

        setattr(self, name, call)
        return call


_lib = None
_why = "not loaded yet"
_said = False


def _library_file() -> Path | None:
    """The library next to this file; MIXDESK_NATIVE_LIB (a path to a library file) wins when it exists:
    a private build tested without overwriting the one other processes have mapped."""
    override = os.environ.get("MIXDESK_NATIVE_LIB")
    if override and Path(override).is_file():
        return Path(override)
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = here / f"_mdk{suffix}"
        if p.exists():
            return p
    found = sorted(here.glob("_mdk*.so")) + sorted(here.glob("_mdk*.pyd")) + sorted(here.glob("_mdk*.dll"))
    return found[0] if found else None


def _load():
    global _lib, _why
    if os.environ.get("MIXDESK_NATIVE", "1") == "0":
        _why = "disabled by MIXDESK_NATIVE=0"
        return None
    path = _library_file()
    if path is None:
        _why = "the native library was not built (no C compiler at install?)"
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        _why = f"the native library {path.name} could not be loaded: {e}"
        return None
    try:
        _declare(lib)
        if lib.mdk_abi() != ABI:
            raise AttributeError(f"its struct layout is version {lib.mdk_abi()}, this code's {ABI}")
    except AttributeError as e:  # a library from an older build lacks a function or has other structs
        _why = f"the native library {path.name} is out of date ({e}); reinstall with pip"
        return None
    want = os.environ.get("MIXDESK_KERNEL_PATH", "").lower()
    cap = {"c": 0, "portable": 0, "avx2": 1, "avx512": 2}.get(want, -1)
    lib.mdk_select_path(cap)
    lib.mdk_amx(0 if os.environ.get("MIXDESK_AMX", "1") == "0" else 1)  # AMX tiles where the CPU has them
    if os.environ.get("MIXDESK_NARROW") in ("0", "1"):  # the AVX2 path's 128-bit kernels forced off / on
        lib.mdk_narrow_kernels(int(os.environ["MIXDESK_NARROW"]))
    lib.mdk_gemm_threshold(-1)  # reads MIXDESK_GEMM_MIN
    _why = ""
    return _Locked(lib)


def _declare(lib) -> None:
    vp, i = c_void_p, c_int
    lib.mdk_abi.restype = i
    lib.mdk_select_path.argtypes, lib.mdk_select_path.restype = [i], i
    lib.mdk_cpu_has_bf16.restype = i
    lib.mdk_amx.argtypes, lib.mdk_amx.restype = [i], i
    lib.mdk_narrow_kernels.argtypes, lib.mdk_narrow_kernels.restype = [i], i
    lib.mdk_flash_amx_calls.restype = ctypes.c_long
    lib.mdk_gemm_threshold.argtypes, lib.mdk_gemm_threshold.restype = [i], i
    lib.mdk_gemm_test.argtypes, lib.mdk_gemm_test.restype = [POINTER(Matrix), vp, i, vp, i], i
    lib.mdk_q4_bytes.argtypes, lib.mdk_q4_bytes.restype = [i, i], ctypes.c_size_t
    lib.mdk_q4_quantize.argtypes = [vp, i, i, i, vp, i]
    lib.mdk_q4_quantize.restype = None
    lib.mdk_q4_dequantize.argtypes = [vp, i, i, vp]
    lib.mdk_q4_dequantize.restype = None
    lib.mdk_q4_dequantize_fmt.argtypes = [vp, i, i, i, vp]
    lib.mdk_q4_dequantize_fmt.restype = None
    lib.mdk_mx4_pack.argtypes = [vp, vp, i, i, vp]
    lib.mdk_mx4_pack.restype = i
    sz = ctypes.c_size_t
    lib.mdk_wq_bytes.argtypes, lib.mdk_wq_bytes.restype = [i, i, i], sz
    lib.mdk_wq_pack.argtypes, lib.mdk_wq_pack.restype = [i, vp, i, i, vp], i
    lib.mdk_wq_unpack.argtypes, lib.mdk_wq_unpack.restype = [i, vp, i, i, vp], i
    lib.mdk_wq_dequantize.argtypes, lib.mdk_wq_dequantize.restype = [i, vp, i, i, i, i, vp], None
    lib.mdk_quantize_blocks.argtypes, lib.mdk_quantize_blocks.restype = [i, vp, i, i, i, vp, i], i
    lib.mdk_raw_dequantize.argtypes, lib.mdk_raw_dequantize.restype = [POINTER(Matrix), i, i, vp], None
    lib.mdk_guard_add.argtypes, lib.mdk_guard_add.restype = [vp, sz], i  # guard.c: SIGBUS in mapped files
    lib.mdk_guard_remove.argtypes, lib.mdk_guard_remove.restype = [i], None
    lib.mdk_guard_faults.argtypes, lib.mdk_guard_faults.restype = [i], i
    lib.mdk_guard_reinstall.restype = i
    lib.mdk_matmul.argtypes = [POINTER(Matrix), vp, i, i, vp, i]
    lib.mdk_matmul.restype = i
    lib.mdk_experts.argtypes = [vp, i, vp, vp, vp, vp, i, i, vp, i, i]
    lib.mdk_experts.restype = i
    lib.mdk_moe.argtypes = [vp, i, POINTER(Matrix), i, i, vp, i, i, vp, i, vp, vp, i]
    lib.mdk_moe.restype = i
    lib.mdk_decode_batch.argtypes = [POINTER(Model), i, vp, vp, vp, vp, vp, vp, vp, i]
    lib.mdk_decode_batch.restype = i
    lib.mdk_matmul_parts.argtypes, lib.mdk_matmul_parts.restype = [vp, i, vp, i, i, vp, i], i
    f = c_float  # deltanet.c: one Gated DeltaNet decode step
    lib.mdk_deltanet_step.argtypes = [i, i, i, i, i, i, vp, vp, vp, vp, vp, vp, vp, vp, vp, f, vp, vp, i]
    lib.mdk_deltanet_step.restype = i
    lo = ctypes.c_long  # flash.c: a prompt's attention over its cache
    lib.mdk_flash.argtypes = [vp, lo, i, i, i, i, i, i, f, vp, vp, i, lo, lo, vp, lo, i, i]
    lib.mdk_flash.restype = i
    lib.mdk_peak.argtypes, lib.mdk_peak.restype = [i, lo, i], ctypes.c_double  # peak.c: for benchmarks


def lib():
    """The loaded library, or None (then the engine uses torch; `status()` says why)."""
    global _lib, _said
    if _lib is None and _why == "not loaded yet":
        _lib = _load()
        if _lib is None and not _said:
            log.warning("native CPU kernels unavailable (%s): using torch's kernels", _why)
            _said = True
    return _lib


def q4_quantize(src: int, fmt: int, n: int, k: int, out: int, threads: int) -> None:
    """Quantise [n, k] to the Q4 tiles. With one thread the call bypasses the lock: that path runs
    inline on the caller's thread and uses neither the pool nor the scratch buffers."""
    L = lib()
    if threads == 1:
        L._cdll.mdk_q4_quantize(src, fmt, n, k, out, 1)
    else:
        L.mdk_q4_quantize(src, fmt, n, k, out, threads)


def available() -> bool:
    return lib() is not None


def gemm_threshold(want: int = -1) -> int:
    """From how many tokens a GGUF matrix's product runs gemm.c's prompt kernel (0: never); want >= 0
    sets it. Returns the one in use."""
    return lib().mdk_gemm_threshold(want)


def set_path(cap: int) -> str:
    """Cap the code path (0 portable C, 1 AVX2, 2 AVX-512; -1 keeps it); returns the active one."""
    return PATHS[lib().mdk_select_path(cap)]


def amx(want: int = -1) -> bool:
    """AMX tiles in use (a prompt's attention over a bf16 cache, flash_amx.c); want 0/1 turns them
    off/on where the CPU has them (tests and benchmarks compare both paths)."""
    return bool(lib().mdk_amx(want))


def narrow(want: int = -1) -> bool:
    """The AVX2 path's 128-bit kernels in use (kraw_narrow.c: on by default where the CPU splits each
    256-bit operation in two, AMD Zen 1); want 0/1 turns them off/on (tests run both on any AVX2 CPU)."""
    return bool(lib().mdk_narrow_kernels(want))


def status() -> str:
    """One line naming the active CPU expert kernel, for the bench, --self-test and the panel."""
    L = lib()
    if L is None:
        return f"torch (native kernels unavailable: {_why})"
    p = L.mdk_select_path(-1)
    extra = (" + BF16" if p == 2 and L.mdk_cpu_has_bf16() else "") + (" + AMX" if L.mdk_amx(-1) else "")
    extra += " (128-bit)" if p == 1 and L.mdk_narrow_kernels(-1) else ""
    return f"native {PATHS[p]}{extra}"


_threads = 0


def threads() -> int:
    """Threads the native kernels use: torch's count when the library first ran (the cores torch
    was set to use), or MIXDESK_THREADS. Fixed afterwards, because the decode step sets torch itself
    to one thread while native calls run (see TorchThreads)."""
    global _threads
    if not _threads:
        _threads = int(os.environ.get("MIXDESK_THREADS", "0")) or torch.get_num_threads()
    return _threads


class TorchThreads:
    """torch's thread count, for the native decode steps. torch's OpenMP workers spin for a while
    after each parallel op; on a 2-core machine that took the native pool's second core and doubled
    the demo's step time (19.9 vs 11.5 ms). At one thread torch never starts them; a prefill's dense
    GEMMs, torch's own, want every thread back.

    Scope: the count is process-wide, so this object belongs to the one thread that drives the model
    (the engine thread; a benchmark's main thread). The forward narrows for decode steps and widens
    for prefills; the driver (the scheduler) widens when it goes idle, so that torch work between
    requests runs at full width. Not re-entrant."""

    def __init__(self):
        self._saved = 0  # torch's count before narrow(); 0 while wide

    def narrow(self) -> None:
        """torch at one thread (a no-op while narrowed, or where torch has one thread anyway)."""
        threads()  # fix the native count before torch's changes
        if not self._saved and torch.get_num_threads() > 1:
            self._saved = torch.get_num_threads()
            torch.set_num_threads(1)

    def widen(self) -> None:
        """torch's threads back, as they were before narrow() (a no-op while wide)."""
        if self._saved:
            torch.set_num_threads(self._saved)
            self._saved = 0


torch_threads = TorchThreads()


def matrix(w: torch.Tensor) -> Matrix:
    """A 16-bit or fp32 weight [N, K] (contiguous, CPU) as the kernel sees it."""
    n, k = w.shape
    return Matrix(FMT[w.dtype], n, k, w.data_ptr(), None, None)


def matmul_parts(ms: list, x: torch.Tensor) -> torch.Tensor:
    """x [T, K] @ [W_0; W_1; ...].T -> [T, sum of N] fp32: stacked matrices of any formats in one call."""
    x = x.contiguous()
    y = torch.empty(x.shape[0], sum(m.n for m in ms), dtype=torch.float32)
    arr = (ctypes.POINTER(Matrix) * len(ms))(*[ctypes.pointer(m) for m in ms])
    if lib().mdk_matmul_parts(arr, len(ms), x.data_ptr(), FMT[x.dtype], x.shape[0], y.data_ptr(), threads()):
        raise MemoryError("native matmul of stacked parts: out of memory for its scratch buffers")
    return y


def matmul(m: Matrix, x: torch.Tensor) -> torch.Tensor:
    """x [T, K] @ W.T -> [T, N] fp32."""
    x = x.contiguous()
    y = torch.empty(x.shape[0], m.n, dtype=torch.float32)
    if lib().mdk_matmul(ctypes.byref(m), x.data_ptr(), FMT[x.dtype], x.shape[0], y.data_ptr(), threads()):
        raise MemoryError("native matmul: out of memory for its scratch buffers")
    return y
