"""4-bit weight formats, one per device (and the 3- and 2-bit CPU tiers: cpu_tier_quantize), each derived from the 16-bit weight of one expert matrix.

Shapes: a weight is W [N, K] (out, in); x [T, K] -> x @ W.T [T, N].

- Q4Native (tier cpu-4 when the native library is built): blocks of 32 along K, w = q * d + m with
  fp16 scale d and minimum m (llama.cpp's Q4_1 grid, 5 bits a weight), repacked for the native
  kernel (engine/native/quant4.c), which multiplies with int8 activations and integer dot products.
  The grid is the same min/max grid as Int4CPU's, with fp16 instead of bf16 scale and minimum.
- Int4CPU (tier cpu-4 without the native library): torch's own int4 CPU kernel (`aten._weight_int4pack_mm_for_cpu`), asymmetric
  groups along K: w = (q - 8) * scale + zero, q in 0..15, bf16 scale and zero (5 bits a weight).
  Measured on this machine class it is ~30x faster than bitsandbytes' CPU path. It computes in
  bf16: the same kernel with fp16 activations is ~50x slower, so activations are converted on the
  way in and out. Groups of 32 (llama.cpp's Q4 block size): on the demo, groups of 64 raised
  perplexity 19% and groups of 32 0% (its weights come from a Q4_1 file with 32-blocks, which this
  grid reproduces; real bf16 checkpoints will show a cost). Plain min/max ranges: a per-group
  search for the clipping ratio with the least weight error made the demo worse (18.3 -> 19.5).
- MX4Native (tier cpu-4 for MXFP4 checkpoints, gpt-oss): the released MXFP4 blocks placed in
  Q4Native's tiles and read through a table (q = 2 * value + 12, d = 2^(e-128), m = -12 d), so the
  same integer kernel runs them without a second rounding.
- NF4 (tier gpu-4): bitsandbytes NF4, blocksize 64, computing in the activations' dtype; on CUDA it
  takes bitsandbytes' fast batch-1 path. bitsandbytes also runs on the CPU (slowly), which keeps
  the tier testable on machines without a GPU.
"""
from __future__ import annotations

import functools

import torch

from .. import native


def _group_size(k: int) -> int:
    for g in (32, 64):
        if k % g == 0:
            return g
    raise ValueError(f"in-features {k} is not a multiple of 32: no 4-bit group size fits")


class Int4CPU:
    def __init__(self, packed: torch.Tensor, scales_zeros: torch.Tensor, group: int, shape: tuple[int, int]):
        self.packed = packed  # [N, K/2] uint8, in the kernel's tile layout
        self.scales_zeros = scales_zeros  # [K/group, N, 2] in the activation dtype
        self.group = group
        self.shape = shape

    @classmethod
    def quantize(cls, w: torch.Tensor, threads: int | None = None) -> "Int4CPU":
        n, k = w.shape
        g = _group_size(k)
        wg = w.float().reshape(n, k // g, g)  # [N, K/g, g]
        lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15).clamp(min=1e-10)
        q = ((wg - lo) / scale).round_().clamp_(0, 15)
        zero = lo + 8 * scale  # the kernel computes (q - 8) * scale + zero
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(n, k).to(torch.int32), 8)
        sz = torch.stack([scale.squeeze(-1), zero.squeeze(-1)], dim=-1)  # [N, K/g, 2]
        return cls(packed, sz.transpose(0, 1).contiguous().to(torch.bfloat16), g, (n, k))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # x [T, K] -> [T, N]
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, self.group,
                                                        self.scales_zeros)
        return y.to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        """The weight this form stands for, [N, K] fp32 (for tests and error measurement)."""
        n, k = self.shape
        eye = torch.eye(k, dtype=self.scales_zeros.dtype)
        return self.matmul(eye).t().float()  # x = I gives W.T

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales_zeros.numel() * self.scales_zeros.element_size()


class Q4Native:
    fmt = native.Q4

    def __init__(self, packed: torch.Tensor, shape: tuple[int, int]):
        self.packed = packed  # uint8: tiles of 16 rows x blocks of 32, 320 bytes each (quant4.c)
        self.shape = shape
        self.desc = native.Matrix(self.fmt, shape[0], shape[1], packed.data_ptr(), None, None)

    def __deepcopy__(self, memo) -> "Q4Native":  # new memory, and a descriptor pointing at it
        return type(self)(self.packed.clone(), self.shape)

    @classmethod
    def quantize(cls, w: torch.Tensor, threads: int | None = None) -> "Q4Native":
        """threads=1 runs on the calling thread without the library's lock (the one-thread
        quantiser touches neither the shared pool nor the scratch buffers), so a migration worker
        can build while the engine thread decodes."""
        return run_to_end(cls.quantize_steps(w, step_bytes=1 << 62, threads=threads))

    @classmethod
    def quantize_steps(cls, w: torch.Tensor, step_bytes: int = 512 << 10, threads: int | None = None):
        """quantize a slice of rows at a time: a generator that yields after each slice of about
        step_bytes of source and returns the Q4Native. Tiles of 16 rows are independent, so a
        build can be spread over the gaps between decode steps."""
        n, k = w.shape
        if k % 32:
            raise ValueError(f"in-features {k} is not a multiple of 32: no 4-bit block fits")
        w = w.contiguous()
        if w.dtype not in native.FMT:
            w = w.float()
        packed = torch.empty(native.lib().mdk_q4_bytes(n, k), dtype=torch.uint8)
        rows = max(16, min(n, step_bytes // (k * w.element_size())) // 16 * 16)
        tile = native.lib().mdk_q4_bytes(16, k)
        for a in range(0, n, rows):
            b = min(n, a + rows)
            native.q4_quantize(w[a:b].data_ptr(), native.FMT[w.dtype], b - a, k,
                               packed.data_ptr() + (a // 16) * tile, threads or native.threads())
            yield
        return cls(packed, (n, k))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # x [T, K] -> [T, N]
        return native.matmul(self.desc, x).to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        """The weight this form stands for, [N, K] fp32."""
        n, k = self.shape
        out = torch.empty(n, k, dtype=torch.float32)
        native.lib().mdk_q4_dequantize_fmt(self.packed.data_ptr(), self.fmt, n, k, out.data_ptr())
        return out

    @property
    def nbytes(self) -> int:
        return self.packed.numel()


class MX4Native(Q4Native):
    """MXFP4 weights (gpt-oss as released) in Q4Native's tiles, read through a table by the same
    integer kernel: the released values exactly, at Q4's 5 bits a weight (quant4.c, MDK_MX4)."""

    fmt = native.MX4

    @classmethod
    def pack(cls, blocks: torch.Tensor, scales: torch.Tensor) -> "MX4Native | None":
        """blocks [N, K/32, 16] and scales [N, K/32] uint8 -> the form, or None where a block's
        scale has no fp16 form in the tiles (then the caller rounds the weight to Q4 instead)."""
        n, g = scales.shape
        blocks, scales = blocks.contiguous(), scales.contiguous()
        packed = torch.empty(native.lib().mdk_q4_bytes(n, 32 * g), dtype=torch.uint8)
        if native.lib().mdk_mx4_pack(blocks.data_ptr(), scales.data_ptr(), n, 32 * g, packed.data_ptr()):
            return None
        return cls(packed, (n, 32 * g))


def run_to_end(steps):
    """Run a generator of build steps to its end; what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def cpu4_format():
    """The cpu-4 weight format of the 5-bit grid: the native kernel's where the library loaded, else
    torch's int4."""
    return Q4Native if native.available() else Int4CPU


# cpu-4 quantises a 16-bit matrix to GGUF's Q4_K (4.5 bits a weight, 6-bit sub-block scales and
# minimums under an fp16 super-scale) where its rows are whole 256-weight super-blocks: less to read
# per token than the 5-bit grid, and no worse an output error on Gaussian, heavy-tailed and
# row-offset weights (benchmarks/q4_grid_quality.py). Other rows keep the 5-bit grid (Q4_0, the
# 4.5-bit 32-block format, has a visibly larger error).
KQUANT_BLOCK = 256


@functools.lru_cache(maxsize=None)
def _q4k_runs() -> bool:
    """Whether this build of the native library quantises and multiplies Q4_K (a 16 x 256 probe)."""
    if not native.available():
        return False
    from gguf import GGMLQuantizationType as GT

    from ..files.gguf.blockquant import BlockQuant

    try:
        w = torch.linspace(-1, 1, 16 * 256).reshape(16, 256)
        q = BlockQuant.quantize(w, GT.Q4_K, threads=1)
        return bool((q.dequantize() - w).abs().max() < 0.1)
    except ValueError:
        return False


def cpu4_uses_q4k(k: int) -> bool:
    return k % KQUANT_BLOCK == 0 and _q4k_runs()


def cpu4_nbytes(n: int, k: int) -> int:
    """Bytes of an [n, k] matrix in the cpu-4 format."""
    if cpu4_uses_q4k(k):
        return n * (k // KQUANT_BLOCK) * 144
    return n * k * 5 // 8


def cpu4_quantize(w: torch.Tensor, threads: int | None = None):
    """The cpu-4 form of one 16-bit matrix [N, K]."""
    return run_to_end(cpu4_quantize_steps(w, step_bytes=1 << 62, threads=threads))


def cpu4_quantize_steps(w: torch.Tensor, step_bytes: int = 512 << 10, threads: int | None = None):
    """cpu4_quantize as a generator yielding after each slice of about step_bytes of source (rows
    are independent in both formats), so a build can be spread over the gaps between decode steps."""
    if not cpu4_uses_q4k(w.shape[1]):
        if cpu4_format() is Q4Native:
            return (yield from Q4Native.quantize_steps(w, step_bytes, threads))
        return cpu4_format().quantize(w, threads)
    return (yield from _blocks_steps(w, "Q4_K", step_bytes, threads))


def _blocks_steps(w: torch.Tensor, qtype: str, step_bytes: int, threads: int | None):
    from gguf import GGMLQuantizationType as GT

    from ..files.gguf.blockquant import BlockQuant, quantize_raw

    n, k = w.shape
    rows = max(1, min(n, step_bytes // (k * w.element_size())))
    parts = []
    for a in range(0, n, rows):
        parts.append(quantize_raw(w[a:a + rows], GT[qtype], threads))
        yield
    return BlockQuant.from_raw(GT[qtype], torch.cat(parts), (n, k))


# cpu-3 and cpu-2: GGUF's Q3_K (3.44 bits a weight) and Q2_K (2.63), llama.cpp's searches
# (engine/native/kquantize_low.c), run by the codes kernels. Only rows of whole 256-weight blocks
# take them: any other matrix keeps its cpu-4 form (the demo's gate and up, 576 wide, stay 4-bit;
# real models' widths are multiples of 256).
LOW_QTYPES = {3: "Q3_K", 2: "Q2_K"}
LOW_BLOCK_BYTES = {3: 110, 2: 84}


def low_bits_run(k: int) -> bool:
    """Whether an [n, k] matrix can be held below 4 bits here (whole blocks, the native library)."""
    return cpu4_uses_q4k(k)


def cpu_tier_nbytes(n: int, k: int, bits: int) -> int:
    """Bytes of an [n, k] matrix in the CPU tier of `bits` (4, 3 or 2)."""
    if bits < 4 and low_bits_run(k):
        return n * (k // KQUANT_BLOCK) * LOW_BLOCK_BYTES[bits]
    return cpu4_nbytes(n, k)


def cpu_tier_quantize_steps(w: torch.Tensor, bits: int, step_bytes: int = 512 << 10, threads: int | None = None):
    """The form of one 16-bit matrix in the CPU tier of `bits` (4: cpu4_quantize_steps)."""
    if bits >= 4 or not low_bits_run(w.shape[1]):
        return (yield from cpu4_quantize_steps(w, step_bytes, threads))
    return (yield from _blocks_steps(w, LOW_QTYPES[bits], step_bytes, threads))


def cpu_tier_quantize(w: torch.Tensor, bits: int, threads: int | None = None):
    return run_to_end(cpu_tier_quantize_steps(w, bits, step_bytes=1 << 62, threads=threads))


class NF4:
    def __init__(self, qweight: torch.Tensor, state, shape: tuple[int, int]):
        self.qweight = qweight
        self.state = state
        self.shape = shape

    @classmethod
    def quantize(cls, w: torch.Tensor, device: torch.device, dtype: torch.dtype) -> "NF4":
        import bitsandbytes.functional as bnbf

        q, state = bnbf.quantize_4bit(w.to(device=device, dtype=dtype).contiguous(), blocksize=64,
                                      quant_type="nf4", compress_statistics=False)
        return cls(q, state, tuple(w.shape))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.qweight.device.type == "cpu":
            # the CPU-device seam for tests: bitsandbytes' CPU matmul is ~30x slower than
            # dequantising (identical values) and multiplying
            return torch.nn.functional.linear(x, self.dequantize().to(x.dtype))
        import bitsandbytes as bnb

        return bnb.matmul_4bit(x, self.qweight.t(), quant_state=self.state)

    def dequantize(self) -> torch.Tensor:
        import bitsandbytes.functional as bnbf

        return bnbf.dequantize_4bit(self.qweight, self.state).float()

    @property
    def nbytes(self) -> int:
        s = self.state
        return self.qweight.numel() * self.qweight.element_size() + s.absmax.numel() * s.absmax.element_size()
