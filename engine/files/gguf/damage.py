"""Which block of a GGUF file holds a scale that is not a number: asked only after a model produced NaN or
Inf scores (engine/runtime/generate.py), so the reply's one error can name the tensor and block instead of
guessing. Every block format keeps its scales as fp16 fields at fixed offsets of each block (IQ1_M
spreads its one over four scale words' top nibbles); a damaged or hand-edited file is the usual cause of
one that is NaN or Inf. The scan reads each tensor's scale columns through the file's mapping (numpy,
column by column), so it touches the whole file once: seconds for a file in the page cache.

Grid indices cannot be out of range (each i-quant's index bits cover its grid exactly) and codes are
any byte pattern, so scales are all a block can get wrong."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GT
from gguf.constants import GGML_QUANT_SIZES

# byte offsets of each block's fp16 fields
FP16_AT = {
    GT.Q4_0: (0,), GT.Q4_1: (0, 2), GT.Q5_0: (0,), GT.Q5_1: (0, 2), GT.Q8_0: (0,),
    GT.Q2_K: (80, 82), GT.Q3_K: (108,), GT.Q4_K: (0, 2), GT.Q5_K: (0, 2), GT.Q6_K: (208,),
    GT.IQ4_NL: (0,), GT.IQ4_XS: (0,), GT.IQ2_XXS: (0,), GT.IQ2_XS: (0,), GT.IQ2_S: (0,), GT.IQ3_XXS: (0,),
    GT.IQ3_S: (0,), GT.IQ1_S: (0,), GT.TQ1_0: (52,), GT.TQ2_0: (64,),
}
CHUNK = 1 << 20  # blocks a column is read in


def _bad_fp16(col: np.ndarray) -> np.ndarray:
    """[n, 2] uint8 little-endian fp16 -> where the exponent is all ones (NaN or Inf)."""
    hi = col[:, 1]
    return (hi & 0x7C) == 0x7C


def first_bad_block(qtype: GT, blocks: np.ndarray) -> int | None:
    """The first block [n, block bytes] whose scale is NaN or Inf, or None."""
    if qtype == GT.IQ1_M:  # fp16 d's exponent: top nibble of word 3 (sign, e4 e3 e2) and of word 2 (e1 e0 ..)
        e = ((blocks[:, 55] >> 4) & 7).astype(np.int32) << 2 | ((blocks[:, 53] >> 6) & 3)
        bad = e == 31
    else:
        bad = np.zeros(len(blocks), dtype=bool)
        for off in FP16_AT.get(qtype, ()):
            bad |= _bad_fp16(blocks[:, off:off + 2])
    i = np.flatnonzero(bad)
    return int(i[0]) if len(i) else None


def find(file) -> str | None:
    """engine/files/gguf/reader.GGUFFile -> "tensor 'NAME' block N (row R) has a scale that is not a number", or
    None where every block's scales are finite."""
    for t in file.tensors.values():
        if t.qtype not in FP16_AT and t.qtype != GT.IQ1_M:
            continue
        _, size = GGML_QUANT_SIZES[t.qtype]
        n = t.nbytes // size
        for b0 in range(0, n, CHUNK):
            nb = min(CHUNK, n - b0)
            blocks = file.view(t, b0 * size, nb * size).numpy().reshape(nb, size)
            bad = first_bad_block(t.qtype, blocks)
            if bad is not None:
                block = b0 + bad
                per_row = t.row_bytes // size
                return (f"tensor '{t.name}' ({t.qtype.name}) has a scale that is not a number in block {block:,} "
                        f"(row {block // per_row:,}): the file is damaged")
    return None
