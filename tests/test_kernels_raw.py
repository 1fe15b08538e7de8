"""The native kernels on a GGUF file's own rows (engine/native/kraw.c, kraw_x86.c; BlockQuant.from_file),
for all 8 block formats on every code path this CPU has (portable C, AVX2, AVX-512): dequantised bit
for bit as gguf.quants does; products equal to the tiles' (kquant.c, qblock.c) up to fp32 rounding, T
= 1, 3, 8 tokens, the MoE shapes and odd row counts; a matrix in two parts (gate's rows and up's, two
places) equals the one-part matrix of the concatenated rows exactly; raw experts in the native MoE call
and raw dense matrices in the native decode step; the rows are only read (a read-only mapping serves);
and the API: mapped, nbytes, deepcopy sharing the rows, MIXDESK_RAW_KERNELS=0 repacking into tiles."""
import copy
import mmap
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as GT
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

from engine import native
from engine.files.gguf.blockquant import BlockQuant, row_bytes
from engine.experts.expert import QuantExpert, run_jobs, run_native
from engine.placement import Tier

from kquant_helpers import random_raw as k_raw
from kquant_helpers import scaled
from native_helpers import path, q8_reference, rel, threads  # noqa: F401  (fixtures: every code path; 1, 2 threads)
from qblock_helpers import random_raw as b_raw

pytestmark = pytest.mark.skipif(not native.available(), reason="native library not built")

# the MoE shapes (Qwen3-30B-A3B's gate/up rows x hidden, down), odd row counts, a K with a Q8_0 tail
SHAPES = [(768, 2048), (2048, 768), (17, 512), (40, 256), (33, 576)]
from kernels_raw_helpers import FORMATS, KQ, rows_of  # noqa: E402,F401 (shared: tests/kernels_raw_helpers.py)


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal up to fp32 rounding, against the output's size (a layout error would be O(1))."""
    return float((got - want).abs().max()) <= 1e-6 * float(want.abs().max())


def shapes_for(qt: GT):
    block = GGML_QUANT_SIZES[qt][0]
    return [s for s in SHAPES if s[1] % block == 0]


def cases():
    return [(qt, s) for qt in FORMATS for s in shapes_for(qt)]


def ids(case):
    qt, (n, k) = case
    return f"{qt.name}-{n}x{k}"


def pair(qt: GT, raw: np.ndarray, shape, split: int | None = None):
    """(the file's rows in one part, or two split at row `split`; the tiles of the same rows)"""
    t = torch.from_numpy(raw)
    parts = [t.reshape(-1)] if split is None else [t[:split].clone().reshape(-1), t[split:].clone().reshape(-1)]
    return BlockQuant.from_file(qt, parts, shape), BlockQuant.from_raw(qt, t, shape)


@pytest.mark.parametrize("case", cases(), ids=ids)
def test_dequantize_is_ggufs_bit_for_bit(case):
    qt, (n, k) = case
    raw = rows_of(qt, n, k, seed=n + k + int(qt))
    want = quants.dequantize(raw, qt).reshape(n, k)
    one, tiles = pair(qt, raw, (n, k))
    two, _ = pair(qt, raw, (n, k), split=n // 3 + 1)
    assert one.mapped and two.mapped and not tiles.mapped
    for q in (one, two):
        assert np.array_equal(q.dequantize().numpy().view(np.uint32), want.view(np.uint32))  # -0.0 alike
        r0, r1 = 3, n - 2  # a range across the parts' seam
        assert np.array_equal(q.dequantize(r0, r1).numpy().view(np.uint32), want[r0:r1].view(np.uint32))
        assert torch.equal(q.raw(), torch.from_numpy(raw))
        assert q.nbytes == n * row_bytes(qt, k) == raw.nbytes
    assert torch.equal(tiles.dequantize(), one.dequantize())


@pytest.mark.parametrize("case", cases(), ids=ids)
def test_matmul_matches_the_tiles(path, case):  # noqa: F811
    qt, (n, k) = case
    raw = rows_of(qt, n, k, seed=7 * n + k + int(qt))
    one, tiles = pair(qt, raw, (n, k))
    two, _ = pair(qt, raw, (n, k), split=n - n // 4 - 1)
    w = torch.from_numpy(quants.dequantize(raw, qt).reshape(n, k))
    g = torch.Generator().manual_seed(n * k)
    for T in (1, 3, 8):
        x = torch.randn(T, k, generator=g)
        want, got = tiles.matmul(x), one.matmul(x)
        # each output against the sum of its terms' sizes (an output may cancel to about 0): the same
        # integer sums in both, only fp32 additions in another order; a layout error would be O(1)
        scale = (q8_reference(x).abs() @ w.abs().t()).clamp(min=1e-30)
        assert float(((got - want).abs() / scale).max()) < 1e-5, (T, float(((got - want).abs() / scale).max()))
        assert torch.equal(two.matmul(x), got)  # gate's and up's rows in two places: the same matrix


@pytest.mark.parametrize("qt", FORMATS, ids=lambda q: q.name)
def test_any_split_and_row_count(path, qt):  # noqa: F811
    """Row counts not a multiple of the kernels' 4 (AVX2: 2) rows, and seams anywhere in a group."""
    k = 256 if qt in KQ else 96
    for n in (1, 2, 5, 19):
        raw = rows_of(qt, n, k, seed=n)
        one, tiles = pair(qt, raw, (n, k))
        x = torch.randn(2, k, generator=torch.Generator().manual_seed(n))
        y = one.matmul(x)
        assert close(y, tiles.matmul(x))
        for split in sorted({0, 1, n // 2, n - 1, n}):
            assert torch.equal(pair(qt, raw, (n, k), split=split)[0].matmul(x), y), split


def test_results_do_not_depend_on_threads_or_batch(monkeypatch):
    raw = rows_of(GT.Q6_K, 300, 1024, seed=3)
    q = BlockQuant.from_file(GT.Q6_K, [torch.from_numpy(raw)], (300, 1024))
    x = torch.randn(6, 1024, generator=torch.Generator().manual_seed(0))
    outs = []
    for n in (1, 2, 3):
        monkeypatch.setattr(native, "_threads", n)
        outs.append(q.matmul(x))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    one_by_one = torch.cat([q.matmul(x[i:i + 1]) for i in range(6)])
    # below the prompt kernel's token count (batched decode: a few streams) the same row kernels
    # run, bit for bit; at and above it (a prompt) gemm.c sums the same integer products in
    # another fp32 order: close, not equal
    few = native.gemm_threshold() - 1
    if few >= 1:
        assert torch.equal(q.matmul(x[:few]), one_by_one[:few])
    assert close(outs[0], one_by_one)


def test_a_new_activation_in_the_same_memory_is_not_served_stale(path):  # noqa: F811
    """The SIMD kernels keep each thread's copy of a token in their own order, keyed by the quantised
    activation's generation: consecutive calls reuse the same scratch memory with new values."""
    raw = rows_of(GT.Q4_K, 64, 512, seed=5)
    one, tiles = pair(GT.Q4_K, raw, (64, 512))
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        x = torch.randn(3, 512, generator=g)
        assert close(one.matmul(x), tiles.matmul(x))
    assert torch.equal(one.matmul(x), one.matmul(x))


def expert_pair(f13: GT, f2: GT, d: int, i: int, seed: int):
    """(an expert on the file's rows: gate's and up's rows two separate tensors; the same in tiles)"""
    w13 = scaled(f13, 2 * i, d, seed, d ** -0.5) if f13 in KQ else None
    if w13 is None:  # 32-weight formats: random valid blocks, scales kept moderate
        w13 = BlockQuant.from_raw(f13, torch.from_numpy(b_raw(f13, 2 * i, d, seed)), (2 * i, d))
    w2 = scaled(f2, d, i, seed + 1, i ** -0.5) if f2 in KQ else BlockQuant.from_raw(
        f2, torch.from_numpy(b_raw(f2, d, i, seed + 1)), (d, i))
    r13, r2 = w13.raw(), w2.raw()
    raw13 = BlockQuant.from_file(f13, [r13[:i].clone().reshape(-1), r13[i:].clone().reshape(-1)], (2 * i, d))
    raw2 = BlockQuant.from_file(f2, [r2.reshape(-1)], (d, i))
    cpu = torch.device("cpu")
    return QuantExpert(Tier.CPU4, raw13, raw2, cpu), QuantExpert(Tier.CPU4, w13, w2, cpu)


@pytest.mark.parametrize("formats", [(GT.Q4_K, GT.Q6_K), (GT.Q4_K, GT.Q4_K), (GT.Q5_K, GT.Q8_0), (GT.Q5_0, GT.Q8_0),
                                     (GT.Q4_0, GT.Q5_1)], ids=lambda f: f"{f[0].name}-{f[1].name}")
@pytest.mark.parametrize("batch", [1, 4, 7])
def test_native_moe_with_raw_experts(path, threads, formats, batch):  # noqa: F811
    """A raw expert in the native fused call (mdk_experts: gate+up, SiLU * up, down) gives the tiled
    one's output: the same integer sums; the intermediate is quantised again, where an fp32 rounding
    difference can move one int8 level."""
    d, i = (2048, 768) if formats[0] in KQ and formats[1] in KQ else (512 if formats[0] in KQ else 576, 256)
    raw_ex, tiled_ex = expert_pair(formats[0], formats[1], d, i, seed=batch + 10 * int(formats[0]))
    assert raw_ex.desc is not None and raw_ex.desc.w13.raw == 1 and raw_ex.desc.w13.w_hi
    assert raw_ex.desc.w13.n_lo == i and raw_ex.desc.w2.raw == 1 and tiled_ex.desc.w13.raw == 0
    x = torch.randn(batch, d, generator=torch.Generator().manual_seed(batch))
    got, want = run_native(raw_ex, x), run_native(tiled_ex, x)
    assert rel(got, want) < 1e-4
    h = q8_reference(x) @ tiled_ex.w13.dequantize().t()  # and both against the reference arithmetic
    a = F.silu(h[:, :i]) * h[:, i:]
    assert rel(got, q8_reference(a) @ tiled_ex.w2.dequantize().t()) < 1e-3


def test_native_moe_mixes_raw_and_tiled_experts(path):  # noqa: F811
    """One mdk_experts call over several experts, some raw and some tiled, routed with weights."""
    d, i = 512, 256
    pairs = [expert_pair(GT.Q4_K, GT.Q6_K, d, i, seed=s) for s in range(4)]
    exs = [p[s % 2] for s, p in enumerate(pairs)]  # raw, tiled, raw, tiled
    T = 5
    x = torch.randn(T, d, generator=torch.Generator().manual_seed(0))
    token = torch.tensor([0, 1, 2, 3, 4, 0, 2, 4, 1, 3])
    weight = torch.rand(10, generator=torch.Generator().manual_seed(1))
    jobs = [(exs[0], 0, 3), (exs[1], 3, 2), (exs[2], 5, 3), (exs[3], 8, 2)]
    got = run_jobs(jobs, x, token, weight)
    want = torch.zeros(T, d)
    for ex, a, c in jobs:
        for s in range(a, a + c):
            want[token[s]] += weight[s] * run_native(ex, x[token[s]:token[s] + 1])[0]
    assert rel(got, want) < 1e-5


@pytest.fixture(scope="module")
def wide(tmp_path_factory):  # hidden 256 and H * Hd 256: the K-quants' rows are 256 wide
    from engine.sources.tiny_model import write_tiny_mixtral

    return write_tiny_mixtral(tmp_path_factory.mktemp("wide_raw"), hidden=256, ffn=256, heads=4, kv_heads=2,
                              tokenizer=False)


def test_native_decode_step_with_raw_dense_weights(wide):
    """The dense matrices as the file's rows (qkv Q4_K, wo Q5_K, tied embedding and lm_head Q6_K): the
    one-call native decode step (decode.c's gemv) gives the torch layer loop's logits exactly (both
    multiply the same raw rows with the same kernels)."""
    from engine.files.checkpoint import Checkpoint
    from engine.model.forward import MoEModel
    from engine.native import choice
    from engine.model.native_step import DecodeStep
    from engine.placement import Placement

    def raw_of(bq):
        return BlockQuant.from_file(bq.qtype, [bq.raw().reshape(-1)], bq.shape)

    ck = Checkpoint(wide)
    d = ck.dims
    m = MoEModel(ck, Placement.uniform(d.layers, d.experts, Tier.CPU4), torch.device("cpu"), torch.bfloat16)
    D, H, G, Hd = d.hidden, d.heads, d.kv_heads, d.head_dim
    for l, layer in enumerate(m.layers):
        layer.wqkv = raw_of(scaled(GT.Q4_K, (H + 2 * G) * Hd, D, seed=10 + l, std=0.5 * D ** -0.5))
        layer.wo = raw_of(scaled(GT.Q5_K, D, H * Hd, seed=50 + l, std=0.5 * (H * Hd) ** -0.5))
    m.embed = m.lm_head = raw_of(scaled(GT.Q6_K, d.vocab, D, seed=60, std=1.0))
    assert choice.whole_step(m)
    step = m.native_step = DecodeStep(m)
    assert choice.step_ready(m)
    assert step.layers[0].qkv[0].raw == 1 and step.layers[0].wo.raw == 1 and step.desc.lm_head.raw == 1
    ids_ = torch.randint(0, d.vocab, (20,), generator=torch.Generator().manual_seed(0))
    outs = []
    for use in (True, False):
        m.native_step = step if use else None
        cache = m.new_cache(64)
        m.forward(ids_[:8], cache, 0)
        outs.append(torch.cat([m.forward(ids_[i:i + 1], cache, i) for i in range(8, 20)]))
    assert torch.equal(outs[0], outs[1])


def test_rows_on_a_read_only_mapping(tmp_path):
    """The rows may be a read-only mapping of the file: the kernels only read them (a write would fault)."""
    n, k = 96, 2048
    raw = rows_of(GT.Q4_K, n, k, seed=9)
    f = tmp_path / "rows.bin"
    f.write_bytes(raw.tobytes())
    with open(f, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: the buffer is not writable
        view = torch.frombuffer(mm, dtype=torch.uint8)
    q = BlockQuant.from_file(GT.Q4_K, [view[: 40 * row_bytes(GT.Q4_K, k)], view[40 * row_bytes(GT.Q4_K, k):]], (n, k))
    tiles = BlockQuant.from_raw(GT.Q4_K, torch.from_numpy(raw), (n, k))
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(0))
    assert close(q.matmul(x), tiles.matmul(x))
    assert torch.equal(q.dequantize(), tiles.dequantize())
    assert q.nbytes == raw.nbytes and q.mapped
    c = copy.deepcopy(q)  # shares the mapping's views: no copy of the file's bytes
    assert [p.data_ptr() for p in c.file_rows] == [p.data_ptr() for p in q.file_rows] and c.desc is not q.desc
    assert torch.equal(c.matmul(x), q.matmul(x))
    del q, c, view


def test_from_file_checks_and_the_tiles_switch(monkeypatch):
    n, k = 20, 512
    raw = torch.from_numpy(rows_of(GT.Q4_K, n, k, seed=1))
    rb = row_bytes(GT.Q4_K, k)
    with pytest.raises(ValueError):  # bytes that are not the shape's
        BlockQuant.from_file(GT.Q4_K, [raw.reshape(-1)[:-rb]], (n, k))
    with pytest.raises(ValueError):  # a part that is not whole rows
        BlockQuant.from_file(GT.Q4_K, [raw.reshape(-1)[:100], raw.reshape(-1)[100:]], (n, k))
    with pytest.raises(ValueError):  # K-quants need rows of a multiple of 256
        BlockQuant.from_file(GT.Q4_K, [torch.zeros(4 * 144, dtype=torch.uint8)], (4, 255))
    with pytest.raises(ValueError):  # not contiguous
        BlockQuant.from_file(GT.Q4_K, [raw.t()], (n, k))
    with pytest.raises(ValueError):  # not a native block format
        BlockQuant.from_file(GT.Q2_K, [raw.reshape(-1)], (n, k))
    q = BlockQuant.from_file(GT.Q4_K, [raw], (n, k))  # any shape of the part: [N, row bytes] here
    assert q.mapped and q.file_rows[0].data_ptr() == raw.data_ptr()  # no copy
    assert q.desc.raw == 1 and not q.desc.w_hi and q.bits == 4.5
    monkeypatch.setenv("MIXDESK_RAW_KERNELS", "0")  # repacked into tiles: the process's own memory
    t = BlockQuant.from_file(GT.Q4_K, [raw[:7].reshape(-1), raw[7:].reshape(-1)], (n, k))
    assert not t.mapped and t.desc.raw == 0 and t.packed is not None
    assert torch.equal(t.dequantize(), q.dequantize())
    c = copy.deepcopy(t)
    assert c.packed.data_ptr() != t.packed.data_ptr() and torch.equal(c.dequantize(), t.dequantize())
    with pytest.raises(IndexError):
        q.dequantize(5, n + 1)
    assert q.dequantize(3, 3).shape == (0, k)


@pytest.mark.parametrize("shape", [(768, 2048), (2048, 768), (17, 512), (5, 256)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_128_bit_q6k_kernel_gives_the_256_bit_ones_products_bit_for_bit(shape):
    """kraw_narrow.c: the AVX2 path's Q6_K in 128-bit vectors, on by default where the CPU runs each 256-bit
    operation as two (mdk_narrow). The same lanes, integer sums and fp32 folds as kraw_x86.c's kernel, so
    the same products bit for bit at every token count the row kernels take, on any AVX2 CPU."""
    L = native.lib()
    if L.mdk_select_path(1) != 1:
        L.mdk_select_path(2)
        pytest.skip("this CPU lacks the AVX2 path")
    n, k = shape
    raw = rows_of(GT.Q6_K, n, k, seed=n + 3 * k)
    one, tiles = pair(GT.Q6_K, raw, (n, k), split=n // 2)
    x = torch.randn(8, k, generator=torch.Generator().manual_seed(k))
    before = native.narrow()
    try:
        for T in (1, 2, 3, 4, 7):
            native.narrow(0)
            wide = one.matmul(x[:T])
            assert native.narrow(1)
            narrow = one.matmul(x[:T])
            assert torch.equal(narrow, wide), T
            assert close(narrow, tiles.matmul(x[:T])), T
    finally:
        native.narrow(int(before))
        L.mdk_select_path(2)
