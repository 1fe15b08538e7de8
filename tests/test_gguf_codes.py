"""GGUF's formats below 4 bits and the i-quants (issue 46): Q2_K, Q3_K, IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS,
IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0, run by the native kernels on the file's own rows
(engine/native/codes.c). Dequantised bit for bit as gguf.quants does; products equal to the int8
activations times those values up to fp32 rounding, on every code path this CPU has and for 1 to 37
tokens; and a tiny Qwen3-MoE whose experts (or dense matrices) are each type: the same perplexity as
transformers on the file's dequantised weights (exact path at fp32: 1e-3; native at bf16: 5e-2), and
it answers. Bad input: a scale that is not a number is one error naming the tensor and block, any byte
pattern in a block never crashes, rows that are not whole blocks are refused naming the tensor."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GT
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

from engine import native
from engine.files.gguf.blockquant import BlockQuant

from gguf_blocks import CODES_TYPES, random_rows

pytestmark = pytest.mark.skipif(not native.available(), reason="native library not built")

SHAPES = [(17, 512), (40, 256), (33, 768)]


def q8_reference(x: torch.Tensor) -> torch.Tensor:
    """The activation as the int8 kernels see it: int8 per block of 32, scale amax / 127."""
    T, K = x.shape
    xb = x.float().reshape(T, K // 32, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    return ((xb * inv).round().clamp(-127, 127) * (amax / 127.0)).reshape(T, K)


@pytest.mark.parametrize("qt", CODES_TYPES, ids=lambda q: q.name)
def test_dequantize_is_ggufs_bit_for_bit(qt):
    for n, k in SHAPES:
        if k % GGML_QUANT_SIZES[qt][0]:
            continue
        raw = random_rows(qt, n, k, seed=n + k + int(qt))
        want = quants.dequantize(raw, qt).reshape(n, k)
        w = BlockQuant.from_file(qt, [torch.from_numpy(raw.reshape(-1).copy())], (n, k))
        assert w.mapped and w.nbytes == raw.size
        assert np.array_equal(w.dequantize().numpy().view(np.uint32), want.view(np.uint32))
        assert np.array_equal(w.dequantize(3, n - 2).numpy().view(np.uint32), want[3:n - 2].view(np.uint32))


@pytest.mark.parametrize("qt", CODES_TYPES, ids=lambda q: q.name)
def test_products_are_the_int8_activations_times_the_values(path, qt):
    n, k = 40, 512
    raw = random_rows(qt, n, k, seed=7 + int(qt))
    values = torch.from_numpy(quants.dequantize(raw, qt).reshape(n, k))
    w = BlockQuant.from_file(qt, [torch.from_numpy(raw.reshape(-1).copy())], (n, k))
    for T in (1, 3, 8, 37):
        x = torch.randn(T, k, generator=torch.Generator().manual_seed(T))
        want = q8_reference(x) @ values.t()
        got = w.matmul(x)
        assert torch.isfinite(got).all()
        assert float((got - want).abs().max()) <= 2e-6 * float(want.abs().max()) * np.sqrt(k), (T, qt.name)


def test_a_matrix_in_two_parts_is_the_one_part_matrix():
    """An expert's gate and up rows are two places in the file: the same products and values."""
    n, k = 34, 512
    raw = random_rows(GT.Q3_K, n, k, seed=3)
    t = torch.from_numpy(raw)
    one = BlockQuant.from_file(GT.Q3_K, [t.reshape(-1).clone()], (n, k))
    two = BlockQuant.from_file(GT.Q3_K, [t[:17].reshape(-1).clone(), t[17:].reshape(-1).clone()], (n, k))
    x = torch.randn(5, k)
    assert torch.equal(one.dequantize(), two.dequantize())
    assert torch.equal(one.matmul(x), two.matmul(x))


# ---- a model whose experts (or every matrix) are one of these types ----------------------------------
SHAPE = dict(layers=2, hidden=256, ffn=256, experts=4, top_k=2, heads=4, kv_heads=2, vocab=320)
EXPERTS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
DENSE = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "token_embd.weight",
         "output.weight")
ALL_ROLES = (GT.Q3_K, GT.Q2_K, GT.IQ4_XS, GT.IQ2_XXS)  # these also as every dense matrix, embedding, output


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    from engine.files.gguf.writer import write_gguf
    from engine.sources.tiny_model import write_tiny_model

    root = tmp_path_factory.mktemp("codes-model")
    src = write_tiny_model(root / "src", "qwen3_moe", **SHAPE)
    return src, write_gguf(src, root / "base.gguf", "f32")[0]


def as_type(base, dst, qt: GT, names) -> object:
    """The base file with the tensors whose names end in one of `names` rewritten as random blocks of qt
    (their RMS kept); a tensor whose rows are not whole blocks stays as it is (llama-quantize falls back
    to another type for those)."""
    from gguf_checks import rewrite

    def swap(ts):
        out = []
        for i, (name, data, t) in enumerate(ts):
            if name.endswith(names) and data.ndim >= 2 and data.shape[-1] % GGML_QUANT_SIZES[qt][0] == 0:
                shape = data.shape  # numpy order: [.., rows, k]
                rows = int(np.prod(shape[:-1]))
                raw = random_rows(qt, rows, shape[-1], seed=i, rms=float(np.sqrt((data.astype(np.float64) ** 2).mean())))
                out.append((name, raw.reshape(*shape[:-1], -1), qt))
            else:
                out.append((name, data, t))
        return out

    return rewrite(base, dst, tensors=swap)


def perplexities(path, ids) -> dict:
    from engine.model.evaluate import perplexity
    from engine.runtime.load import load

    got = {}
    for dtype in ("fp32", "bf16"):
        ld = load(path, placement="cpu", device="cpu", dtype=dtype)
        try:
            got[dtype] = perplexity(ld.model, ids.tolist())
        finally:
            ld.ckpt.close()
    return got


@pytest.mark.parametrize("qt", CODES_TYPES, ids=lambda q: q.name)
def test_a_model_of_each_type_gives_the_reference_perplexity_and_answers(source, tmp_path, qt):
    """fp32: every expert the exact dequantisation (1e-3 of transformers on the same values); bf16: the
    file's own blocks in the native kernels (int8 activations: 5e-2). Then a greedy reply of 6 tokens."""
    from engine.runtime.client import Client
    from engine.protocol.sampling import SamplingParams

    from gguf_reference import ppl, reference

    src, base = source
    roles = EXPERTS + (DENSE if qt in ALL_ROLES else ())
    path = as_type(base, tmp_path / f"{qt.name}.gguf", qt, roles)
    ids = torch.randint(3, SHAPE["vocab"], (64,), generator=torch.Generator().manual_seed(int(qt)))
    want = ppl(reference(src, path), ids)
    got = perplexities(path, ids)
    assert abs(got["fp32"] - want) / want < 1e-3, (got, want)
    assert abs(got["bf16"] - want) / want < 5e-2, (got, want)
    client = Client()
    try:
        client.load(str(path), "cpu", "cpu", "bf16", 64)
        done = client.generate(prompt_ids=[5, 6, 7], params=SamplingParams(max_new_tokens=6))
        assert done.reason == "length" and len(done.token_ids) == 6
    finally:
        client.close()


# ---- bad input ------------------------------------------------------------------------------------------
def test_a_scale_that_is_not_a_number_is_one_error_naming_the_tensor_and_block(source, tmp_path):
    """A Q3_K output matrix whose block 3 has a NaN scale: the reply ends with one error that names the
    tensor and the block (engine/files/gguf/damage.py), not only "NaN scores"; the engine serves on."""
    from gguf import GGUFReader

    from engine.runtime.client import Client, EngineError
    from engine.protocol.sampling import SamplingParams

    import gguf_files

    _, base = source
    path = as_type(base, tmp_path / "nan.gguf", GT.Q3_K, EXPERTS + DENSE)

    t = next(x for x in GGUFReader(str(path)).tensors if x.name == "output.weight")
    gguf_files.flip(path, int(t.data_offset) + 3 * 110 + 108, bytes([0x00, 0x7E]))  # block 3's d: NaN
    client = Client()
    try:
        client.load(str(path), "cpu", "cpu", "bf16", 64)
        for _ in range(2):  # the same one error each time: the engine thread serves on
            with pytest.raises(EngineError) as e:
                client.generate(prompt_ids=[5, 6, 7], params=SamplingParams(max_new_tokens=4))
            msg = str(e.value)
            assert "output.weight" in msg and "block 3" in msg and "not a number" in msg, msg
    finally:
        client.close()


@pytest.mark.parametrize("qt", CODES_TYPES, ids=lambda q: q.name)
def test_any_bytes_in_a_block_never_crash(qt):
    """Every byte pattern is a block (grid indices cannot leave their grids): random bytes, scales too,
    give gguf's values where those are finite, and the kernels never crash."""
    n, k = 8, 512
    raw = np.random.default_rng(int(qt)).integers(0, 256, size=(n, k // GGML_QUANT_SIZES[qt][0] * GGML_QUANT_SIZES[qt][1]),
                                                  dtype=np.uint8)
    w = BlockQuant.from_file(qt, [torch.from_numpy(raw.reshape(-1).copy())], (n, k))
    want = quants.dequantize(raw, qt).reshape(n, k)
    got = w.dequantize().numpy()
    ok = np.isfinite(want)
    assert np.array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32)) and not np.isfinite(got[~ok]).any()
    w.matmul(torch.randn(3, k))  # finite or not, it returns


def test_rows_that_are_not_whole_blocks_are_refused_naming_the_tensor(source, tmp_path):
    from engine.protocol.errors import ModelError
    from engine.files.gguf import open_gguf

    import gguf_files

    _, base = source
    path = as_type(base, tmp_path / "short.gguf", GT.IQ4_XS, EXPERTS)
    name = "blk.0.ffn_up_exps.weight"
    pos = gguf_files.type_pos(path, name) - 8 * 3  # its ne[0] (three dimensions before the type)
    gguf_files.flip(path, pos, (128).to_bytes(8, "little"))
    with pytest.raises(ModelError) as e:
        open_gguf(path).close()
    assert name in str(e.value) and "whole IQ4_XS blocks of 256" in str(e.value)
