"""A prompt's attention in flash.c (engine/native/flash.py): the same numbers as torch's fp32
scaled_dot_product_attention for head dims 64/128/256, grouped heads, queries after a cached prefix,
token counts off its 32-key blocks and 128-row tasks, sliding windows and fp32/bf16/fp16 caches; the
weights rounded to bf16 only where the values are bf16 already. Where the CPU has AMX, a bf16 cache's
attention runs in tiles (flash_amx.c): each case both ways, the tiles' against SDPA on the queries
rounded to bf16 (as the tiles read them), and a bf16 model's logits the same either way. A model whose prompt attention runs in
it keeps transformers' logits (fp32, 1e-4), read in one go or in chunks; where it does not apply it
says so (None) and the layer's torch path runs."""
import pytest
import torch
import torch.nn.functional as F

from engine import native
from engine.files.checkpoint import Checkpoint
from engine.model.forward import MoEModel
from engine.native import flash
from engine.placement import Placement, Tier

pytestmark = pytest.mark.skipif(not native.available(), reason="native library not built")


@pytest.fixture
def avx512():
    lib = native.lib()
    active = lib.mdk_select_path(-1)
    if lib.mdk_select_path(2) != 2:
        lib.mdk_select_path(active)
        pytest.skip("this CPU lacks AVX-512: torch computes the prompt's attention")
    yield
    lib.mdk_select_path(active)


@pytest.fixture(params=["avx512", "amx"])
def tiles(request, avx512):
    """Each bf16 case on the AVX-512 path and (where the CPU has AMX) in AMX tiles; yields whether tiles run."""
    want = request.param == "amx"
    if want and not native.amx(1):
        pytest.skip("this CPU has no AMX tiles (or the OS does not grant them)")
    native.amx(int(want))
    yield want
    native.amx(1)


def reference(q, k, v, q0, window, scale=None):
    """torch's SDPA in fp32 with the mask spelled out: q [n, H, Hd], k/v [G, S, Hd] -> [n, H*Hd]."""
    n, S = q.shape[0], k.shape[1]
    qp, kp = torch.arange(q0, q0 + n)[:, None], torch.arange(S)[None]
    mask = kp <= qp
    if window:
        mask &= (qp - kp) < window
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None].float(), k[None].float(), v[None].float(),
                                         attn_mask=mask, enable_gqa=True, scale=scale)[0]
    return out.transpose(0, 1).reshape(n, -1)


def rel(got, want) -> float:
    return float((got - want).abs().max()) / float(want.abs().max())


CASES = [  # H, G, Hd, n, q0, window
    (8, 2, 64, 37, 0, None),
    (8, 8, 64, 130, 45, None),
    (32, 4, 128, 200, 300, None),
    (16, 1, 128, 16, 1000, None),
    (4, 2, 256, 70, 33, None),
    (8, 4, 128, 150, 200, 64),
    (8, 4, 64, 300, 0, 100),
]


@pytest.mark.parametrize("H,G,Hd,n,q0,window", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_flash_gives_torchs_attention(tiles, H, G, Hd, n, q0, window, dtype):
    g = torch.Generator().manual_seed(H * n + q0)
    S = q0 + n
    qk = torch.randn(n, H + G, Hd, generator=g)  # the projection's rows: q then k, strided
    cache_k = (torch.randn(G, S + 40, Hd, generator=g) * 2).to(dtype)  # a cache longer than its use
    cache_v = torch.randn(G, S + 40, Hd, generator=g).to(dtype)
    k, v = cache_k[:, :S], cache_v[:, :S]
    want = reference(qk[:, :H], k, v, q0, window, scale=0.1)
    exact = flash.attend(qk[:, :H], k, v, q0, window, 0.1, bf16_values=False)
    assert exact is not None and exact.shape == (n, H * Hd)
    assert rel(exact, want) < 1e-5
    before = native.lib().mdk_flash_amx_calls()
    rounded = flash.attend(qk[:, :H], k, v, q0, window, 0.1, bf16_values=True)
    in_tiles = native.lib().mdk_flash_amx_calls() > before
    assert in_tiles == (tiles and dtype == torch.bfloat16)  # tiles for a bf16 cache alone, where in use
    if in_tiles:  # the queries are rounded to bf16 as the tiles read them, then as exact as the bf16 path
        assert rel(rounded, reference(qk[:, :H].bfloat16(), k, v, q0, window, scale=0.1)) < 5e-3
        assert rel(rounded, want) < 1e-2
    else:
        assert rel(rounded, want) < (5e-3 if native.lib().mdk_cpu_has_bf16() else 1e-5)


def test_a_window_at_the_keys_start_and_a_window_of_one(avx512):
    g = torch.Generator().manual_seed(5)
    qk, k, v = torch.randn(64, 6, 64, generator=g), torch.randn(2, 64, 64, generator=g), torch.randn(2, 64, 64, generator=g)
    for window in (1, 31, 32, 33):
        got = flash.attend(qk[:, :4], k, v, 0, window, None, bf16_values=False)
        assert rel(got, reference(qk[:, :4], k, v, 0, window)) < 1e-5, window
    one = flash.attend(qk[:, :4], k, v, 0, 1, None, bf16_values=False)  # each query sees only itself
    assert torch.allclose(one.view(64, 4, 64), v.repeat_interleave(2, 0).transpose(0, 1), atol=1e-6)


def test_what_it_does_not_take_is_left_to_torch(avx512):
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(32, 4, 96, generator=g), torch.randn(2, 32, 96, generator=g)
    assert flash.attend(q, k, k, 0, None, None) is None  # head dim 96
    q, k = torch.randn(32, 4, 64, generator=g), torch.randn(2, 32, 64, generator=g)
    assert flash.attend(q, k, k[:, :, :32].contiguous(), 0, None, None) is None  # values of another width
    assert flash.attend(q.to(torch.bfloat16), k, k, 0, None, None) is None  # bf16 queries
    assert flash.attend(q[:8], k[:, :8], k[:, :8], 0, None, None) is None  # too few queries to pay
    lib = native.lib()
    if lib.mdk_select_path(1) == 1:  # the AVX2 path: torch's SDPA instead
        assert flash.attend(q, k, k, 0, None, None) is None
    lib.mdk_select_path(2)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A tiny Mixtral with 64-wide heads (flash.c's smallest) and a sliding window shorter than the prompt."""
    from engine.sources.tiny_model import write_tiny_mixtral

    return write_tiny_mixtral(tmp_path_factory.mktemp("wide"), hidden=128, heads=4, kv_heads=2, head_dim=64,
                              sliding_window=48)


def test_a_model_reading_its_prompt_in_flash_keeps_transformers_logits(avx512, wide, monkeypatch):
    from transformers import MixtralForCausalLM

    ck = Checkpoint(wide)
    ids = torch.randint(0, ck.dims.vocab, (150,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = MixtralForCausalLM.from_pretrained(str(wide), dtype=torch.float32).eval()(ids[None]).logits[0]
    calls = []
    real = flash.attend
    monkeypatch.setattr(flash, "attend", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    model = MoEModel(ck, Placement.uniform(ck.dims.layers, ck.dims.experts, Tier.CPU16), torch.device("cpu"),
                     torch.float32)
    whole = model.forward(ids, model.new_cache(256), 0, all_logits=True)
    assert (whole - want).abs().max().item() < 1e-4
    cache = model.new_cache(256)
    parts = [model.forward(ids[a:b], cache, a, all_logits=True) for a, b in ((0, 70), (70, 100), (100, 150))]
    assert (torch.cat(parts) - want).abs().max().item() < 1e-4
    assert calls and all(n >= flash.MIN_TOKENS for n in calls)  # flash.c read these prompts


def test_decode_after_a_long_prompt_reads_its_rows_in_blocks_and_keeps_transformers_logits(avx512, tmp_path):
    """The native decode step's attention (attention.c) takes the keys and values in blocks of 128
    positions for all of a group's heads: after 300 positions (three blocks, an odd tail) its logits
    are still transformers'."""
    from transformers import MixtralForCausalLM

    from engine.native import choice
    from engine.sources.tiny_model import write_tiny_mixtral

    folder = write_tiny_mixtral(tmp_path / "m", hidden=128, heads=8, kv_heads=2, head_dim=64)
    ck = Checkpoint(folder)
    ids = torch.randint(0, ck.dims.vocab, (311,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = MixtralForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()(ids[None]).logits[0]
    model = MoEModel(ck, Placement.uniform(ck.dims.layers, ck.dims.experts, Tier.CPU16), torch.device("cpu"),
                     torch.float32)
    assert choice.whole_step(model)  # the decode steps run in decode.c
    cache = model.new_cache(400)
    got = [model.forward(ids[:300], cache, 0, all_logits=True)]
    got += [model.forward(ids[i:i + 1], cache, i) for i in range(300, 311)]
    assert (torch.cat(got) - want).abs().max().item() < 1e-4


def kl(got, want) -> float:
    """Mean KL divergence of want's next-token distributions from got's."""
    return F.kl_div(got.float().log_softmax(-1), want.float().log_softmax(-1), log_target=True,
                    reduction="none").sum(-1).mean().item()


def test_a_bf16_model_reads_its_prompt_in_amx_tiles_as_close_as_transformers_bf16(avx512, wide):
    """A bf16 model's 150-token prompt, its attention in AMX tiles (the queries rounded to bf16, as a bf16
    model's are): its next-token distributions stay as close to the fp32 model's as transformers' own
    bf16 forward does (measured here: KL 3.0e-4 against transformers' 2.2e-4; the AVX-512 path 0.9e-4)."""
    from transformers import MixtralForCausalLM

    if not native.amx(1):
        pytest.skip("this CPU has no AMX tiles (or the OS does not grant them)")
    ck = Checkpoint(wide)
    ids = torch.randint(0, ck.dims.vocab, (150,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        fp32 = MixtralForCausalLM.from_pretrained(str(wide), dtype=torch.float32).eval()(ids[None]).logits[0]
        bf16 = MixtralForCausalLM.from_pretrained(str(wide), dtype=torch.bfloat16).eval()(ids[None]).logits[0]
    model = MoEModel(ck, Placement.uniform(ck.dims.layers, ck.dims.experts, Tier.CPU16), torch.device("cpu"),
                     torch.bfloat16)
    before = native.lib().mdk_flash_amx_calls()
    got = model.forward(ids, model.new_cache(256), 0, all_logits=True)
    assert native.lib().mdk_flash_amx_calls() > before  # the prompt's attention ran in tiles
    assert kl(got, fp32) < 2 * kl(bf16, fp32)
