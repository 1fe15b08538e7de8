"""Shared by several test modules (moved out of tests/test_kernels_raw.py, which uses them too): FORMATS, rows_of."""
import numpy as np
from gguf import GGMLQuantizationType as GT
from kquant_helpers import random_raw as k_raw
from native_helpers import path, q8_reference, rel, threads  # noqa: F401  (fixtures: every code path; 1, 2 threads)
from qblock_helpers import random_raw as b_raw


FORMATS = [GT.Q4_K, GT.Q5_K, GT.Q6_K, GT.Q8_0, GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1]


KQ = (GT.Q4_K, GT.Q5_K, GT.Q6_K)


def rows_of(qt: GT, n: int, k: int, seed: int) -> np.ndarray:
    """Valid raw rows [n, row bytes] (32-weight formats: some scales +-0 and fp16 subnormals too)."""
    return k_raw(qt, n, k, seed) if qt in KQ else b_raw(qt, n, k, seed, special=True)

