"""Builds the native CPU kernels (engine/native/*.c) with the system compiler during `pip install`.

The library is plain C loaded with ctypes (no torch headers, so no torch is downloaded into an
isolated build). It is optional: without a compiler the install still succeeds and the engine runs
its torch kernels, saying so. No -march flag: one binary chooses AVX-512 / AVX2 / C at run time.
"""
import sys

from setuptools import Extension, setup

if sys.platform == "win32":
    args = ["/O2"]
else:
    args = ["-O3", "-std=c11", "-pthread", "-fvisibility=hidden", "-Wno-unused-function"]

setup(ext_modules=[Extension(
    "engine.native._mdk",
    sources=[f"engine/native/{n}.c" for n in ("cpu", "convert", "quant4", "kquant", "kquant_x86", "qblock", "kquantize", "kquantize_low", "dense", "moe", "attention", "decode", "guard", "kraw", "kraw_x86", "kraw_narrow", "codes", "codes_x86", "codes_rows", "codes_avx2", "codes_k23_avx2", "gemm", "flash", "flash_amx", "peak", "deltanet")],
    depends=["engine/native/mdk.h", "engine/native/kquant.h", "engine/native/kraw.h", "engine/native/codes.h", "engine/native/codes_simd.h", "engine/native/codes_avx2.h", "engine/native/iq_grids.h", "engine/native/amx.h", "engine/native/vexp.h"],
    extra_compile_args=args,
    extra_link_args=[] if sys.platform == "win32" else ["-pthread", "-lm"],
    optional=True,
)])
