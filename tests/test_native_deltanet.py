"""The Gated DeltaNet decode step (engine/native/deltanet.c, engine/native/deltanet.py) against
transformers' own Qwen3.5-MoE pieces: five consecutive tokens through (a) transformers (F.conv1d on the
concatenated conv history, checked equal to causal_conv1d_update, torch_recurrent_gated_delta_rule with the
in-kernel q/k L2 norm, Qwen3_5MoeRMSNormGated), (b) deltanet.reference and (c) the native step on every
code path this CPU has, with 1 and 2 threads. Outputs, conv histories and recurrent states agree within
1e-5 of their largest magnitude."""
import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (Qwen3_5MoeRMSNormGated, causal_conv1d_update,
                                                                   torch_recurrent_gated_delta_rule)

from engine import native
from engine.native import deltanet

# (Hk, Dk, Hv, Dv, K): grouped heads, Hk == Hv, Dk != Dv, odd dims for the vector tails (Dv 203: a full
# block of 128 columns and a partial one; Dk 7 and 37: rows left over from groups of four), other tap
# counts, and Qwen3.5-35B-A3B's real size last
SIZES = [(2, 16, 4, 16, 4), (3, 32, 3, 32, 4), (2, 32, 4, 48, 4), (1, 24, 3, 40, 4), (2, 24, 2, 40, 3),
         (2, 8, 6, 20, 1), (1, 7, 2, 13, 2), (1, 37, 2, 203, 4), (16, 128, 32, 128, 4)]
IDS = ["Hk%d-Dk%d-Hv%d-Dv%d-K%d" % s for s in SIZES]
TOKENS, EPS = 5, 1e-6


def close(got, want, what):
    assert got.shape == want.shape, f"{what}: shape {list(got.shape)}, expected {list(want.shape)}"
    if not want.numel():  # K = 1: no conv history
        return
    err, scale = (got - want).abs().max().item(), want.abs().max().item()
    assert err <= 1e-5 * scale, f"{what}: max error {err:.3g} over max magnitude {scale:.3g}"


def make(size, seed=0):
    """A layer's parameters, its starting conv history and state, and TOKENS tokens' projections."""
    Hk, Dk, Hv, Dv, K = size
    C = 2 * Hk * Dk + Hv * Dv
    g = torch.Generator().manual_seed(seed + sum(size))
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    layer = dict(conv_w=r(C, K) * 0.5, A_log=torch.log(torch.rand(Hv, generator=g) * 15.99 + 0.01),
                 dt_bias=r(Hv) * 0.5, norm_w=1 + 0.1 * r(Dv))
    start = dict(conv=r(C, K - 1), state=r(Hv, Dk, Dv) * 0.3)
    tokens = [dict(qkv=r(C), a=r(Hv), b=r(Hv), z=r(Hv * Dv)) for _ in range(TOKENS)]
    return layer, start, tokens


def run_transformers(size, layer, start, tokens):
    """The tokens through transformers' own functions; returns outputs [TOKENS, Hv*Dv], conv, state."""
    Hk, Dk, Hv, Dv, K = size
    C = 2 * Hk * Dk + Hv * Dv
    hist, S = start["conv"].clone()[None], start["state"].clone()[None]  # [1, C, K-1], [1, Hv, Dk, Dv]
    hist2 = hist.clone()  # for causal_conv1d_update itself, which updates it in place
    norm = Qwen3_5MoeRMSNormGated(Dv, eps=EPS)
    with torch.no_grad():
        norm.weight.copy_(layer["norm_w"])
    outs = []
    for t in tokens:
        x = torch.cat([hist, t["qkv"][None, :, None]], dim=-1)  # causal_conv1d_update's torch path
        hist = x[:, :, 1:]
        y = F.silu(F.conv1d(x, layer["conv_w"].unsqueeze(1), None, padding=0, groups=C)[:, :, -1:])
        if K > 1:  # the same, as transformers' decode step calls it (its torch fallback)
            y2 = causal_conv1d_update(t["qkv"][None, :, None], hist2, layer["conv_w"], None, "silu")
            assert torch.equal(y, y2) and torch.equal(hist, hist2)
        q, k, v = y.transpose(1, 2).split([Hk * Dk, Hk * Dk, Hv * Dv], dim=-1)
        q, k, v = q.reshape(1, 1, Hk, Dk), k.reshape(1, 1, Hk, Dk), v.reshape(1, 1, Hv, Dv)
        g = -layer["A_log"].exp() * F.softplus(t["a"] + layer["dt_bias"])
        beta = t["b"].sigmoid()
        o, S = torch_recurrent_gated_delta_rule(q, k, v, g=g[None, None], beta=beta[None, None], initial_state=S,
                                                output_final_state=True, use_qk_l2norm_in_kernel=True)
        with torch.no_grad():
            outs.append(norm(o.reshape(-1, Dv), t["z"].reshape(-1, Dv)).reshape(-1))
    return torch.stack(outs), hist[0], S[0]


def run_ours(fn, size, layer, start, tokens, **kw):
    conv, state = start["conv"].clone(), start["state"].clone()
    outs = [fn(size[0], t["qkv"], conv, layer["conv_w"], t["a"], t["b"], layer["A_log"], layer["dt_bias"], t["z"],
               layer["norm_w"], EPS, state, **kw).clone() for t in tokens]
    return torch.stack(outs), conv, state


@pytest.fixture(scope="module")
def expected():
    """transformers' results per size, computed once for every path and thread count"""
    cache = {}

    def get(size):
        if size not in cache:
            layer, start, tokens = make(size)
            cache[size] = (layer, start, tokens, run_transformers(size, layer, start, tokens))
        return cache[size]
    return get


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_reference_matches_transformers(expected, size):
    layer, start, tokens, want = expected(size)
    got = run_ours(deltanet.reference, size, layer, start, tokens)
    for g, w, what in zip(got, want, ("output", "conv history", "state")):
        close(g, w, what)


needs_native = pytest.mark.skipif(not native.available() or not hasattr(native.lib(), "mdk_deltanet_step"),
                                  reason="the native library is not built (or predates deltanet.c)")


@pytest.fixture(params=[0, 1, 2], ids=["c", "avx2", "avx512"])
def path(request):
    active = native.lib().mdk_select_path(-1)
    if request.param > native.lib().mdk_select_path(request.param):
        native.lib().mdk_select_path(active)
        pytest.skip("this CPU lacks that path")
    yield request.param
    native.lib().mdk_select_path(active)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_native_step_matches_transformers_and_reference(expected, path, threads, size):
    layer, start, tokens, want = expected(size)
    ref = run_ours(deltanet.reference, size, layer, start, tokens)
    got = run_ours(deltanet.step, size, layer, start, tokens, threads=threads)
    for g, w, r, what in zip(got, want, ref, ("output", "conv history", "state")):
        close(g, w, what + " vs transformers")
        close(g, r, what + " vs reference")
    assert torch.equal(got[1], ref[1]), "the conv history is a copy of the inputs: exact"


@needs_native
def test_native_step_does_not_depend_on_threads(path):
    size = (4, 32, 8, 48, 4)
    layer, start, tokens = make(size, seed=7)
    one = run_ours(deltanet.step, size, layer, start, tokens, threads=1)
    two = run_ours(deltanet.step, size, layer, start, tokens, threads=2)
    for a, b in zip(one, two):
        assert torch.equal(a, b)


@needs_native
def test_native_step_writes_into_out():
    size = (2, 16, 4, 16, 4)
    layer, start, tokens = make(size)
    out = torch.full((4 * 16,), float("nan"))
    t = tokens[0]
    got = deltanet.step(2, t["qkv"], start["conv"].clone(), layer["conv_w"], t["a"], t["b"], layer["A_log"],
                        layer["dt_bias"], t["z"], layer["norm_w"], EPS, start["state"].clone(), out=out, threads=1)
    assert got is out and torch.isfinite(out).all()


def test_bad_arguments_are_refused_naming_them():
    size = (2, 16, 4, 16, 4)
    layer, start, tokens = make(size)
    t = tokens[0]
    args = dict(qkv=t["qkv"], conv=start["conv"], conv_w=layer["conv_w"], a=t["a"], b=t["b"], A_log=layer["A_log"],
                dt_bias=layer["dt_bias"], z=t["z"], norm_w=layer["norm_w"], eps=EPS, state=start["state"])
    for fn in (deltanet.reference, deltanet.step):
        with pytest.raises(ValueError, match="key_heads"):
            fn(3, **args)
        with pytest.raises(ValueError, match="^z:"):
            fn(2, **{**args, "z": t["z"][:-1]})
        with pytest.raises(ValueError, match="^conv:"):
            fn(2, **{**args, "conv": start["conv"].t().contiguous().t()})  # the right shape, not contiguous
        with pytest.raises(ValueError, match="^a:"):
            fn(2, **{**args, "a": t["a"].double()})


@needs_native
def test_native_refuses_sizes_it_cannot_hold():
    Hk, Dk, Hv, Dv, K = 1, 1025, 1, 4, 2  # a key head dim over deltanet.c's 1024
    C = 2 * Hk * Dk + Hv * Dv
    z = lambda *s: torch.zeros(*s)  # noqa: E731
    with pytest.raises(RuntimeError, match="bad sizes"):
        deltanet.step(Hk, z(C), z(C, K - 1), z(C, K), z(Hv), z(Hv), z(Hv), z(Hv), z(Hv * Dv), z(Dv), EPS,
                      z(Hv, Dk, Dv), threads=1)


@pytest.mark.parametrize("size", [(2, 16, 4, 16, 4), (16, 128, 32, 128, 4)], ids=["tiny", "real"])
def test_tiled_value_heads_are_the_grouped_heads_reordered(path, size):
    """tiled=True (value head h uses key head h % Hk: a GGUF's order) on inputs whose value heads are
    tiled gives the grouped step's results in that order: native and reference alike."""
    from engine.files.gguf.qwen35 import tiled_heads

    Hk, Dk, Hv, Dv, K = size
    layer, start, tokens = make(size, seed=3)
    heads = tiled_heads(Hk, Hv)  # grouped head h is the file's head heads[h]
    order = torch.empty_like(heads)
    order[heads] = torch.arange(Hv)  # the file's head j is grouped head order[j]
    vrows = lambda x, w: x.view(-1, Hv, w)[:, order].reshape(x.shape)  # noqa: E731

    def tile(d):
        out = dict(d)
        for key, w in (("a", 1), ("b", 1), ("A_log", 1), ("dt_bias", 1), ("z", Dv)):
            if key in out:
                out[key] = vrows(out[key][None], w)[0].contiguous()
        for key in ("qkv", "conv", "conv_w"):
            if key in out:
                t = out[key]
                head = t[:2 * Hk * Dk]
                v = t[2 * Hk * Dk:].reshape(Hv, Dv, *t.shape[1:])[order].reshape(Hv * Dv, *t.shape[1:])
                out[key] = torch.cat([head, v]).contiguous()
        if "state" in out:
            out["state"] = out["state"][order].contiguous()
        return out
    want = run_ours(deltanet.reference, size, layer, start, tokens)
    tiled = [tile(t) for t in tokens]
    for fn in (deltanet.reference, deltanet.step):
        got = run_ours(fn, size, tile(layer), tile(start), tiled, tiled=True)
        close(got[0].view(TOKENS, Hv, Dv), want[0].view(TOKENS, Hv, Dv)[:, order], f"{fn.__name__} out")
        close(got[2], want[2][order], f"{fn.__name__} state")
