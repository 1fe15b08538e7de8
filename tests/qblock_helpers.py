"""Shared by several test modules (moved out of tests/test_qblock.py, which uses them too): random_raw."""
import numpy as np
from gguf import GGMLQuantizationType as GT
from gguf.constants import GGML_QUANT_SIZES
from native_helpers import path, q8_reference, rel, threads  # noqa: F401  (fixtures)


WITH_MIN = (GT.Q4_1, GT.Q5_1)


def random_raw(qtype: GT, n: int, k: int, seed: int, special: bool = False) -> np.ndarray:
    """n rows of valid blocks: random quant bytes, a finite fp16 d (and m) of moderate size. special:
    some d and m are +-0 or fp16 subnormals, which files hold too."""
    rng = np.random.default_rng(seed)
    bs, ts = GGML_QUANT_SIZES[qtype]
    nb = k // bs
    raw = rng.integers(0, 256, (n, nb, ts), dtype=np.uint8)
    fields = [0, 2] if qtype in WITH_MIN else [0]
    for off in fields:
        v = (rng.standard_normal((n, nb)) * (0.01 if off == 0 else 0.05)).astype(np.float16)
        if special:
            pick = rng.random((n, nb))
            v[pick < 0.1] = np.float16(0.0)
            v[(pick >= 0.1) & (pick < 0.15)] = np.float16(-0.0)
            v[(pick >= 0.15) & (pick < 0.25)] = np.float16(3e-6)  # subnormal
        raw[..., off:off + 2] = v.view(np.uint8).reshape(n, nb, 2)
    return raw.reshape(n, nb * ts)

