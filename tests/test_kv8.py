"""8-bit keys and values (Load.kv_bits = 8, engine/kv/int8.py): the rows' rounding, a model's logits
beside its 16-bit cache's, the native decode step against the torch forward on the same 8-bit cache
(every kernel path), the bytes a token and the planner's count of them, a kept cache's file, and the
--kv-bits option from the command line to the Loaded line."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.kv import int8 as kv8
from engine import native
from engine.files.checkpoint import Checkpoint
from engine.control.context_fit import model_cost
from engine.protocol.errors import InputError
from engine.model.forward import MoEModel
from engine.placement import Placement, Tier
from engine.planning.kv_reservation import choose_length, int8_element_bytes


@pytest.fixture(scope="module")
def hd64(tmp_path_factory):  # 8 query heads over 2 kv groups of 64 wide: attention.c's per-head kernel
    from engine.sources.tiny_model import write_tiny_mixtral

    return write_tiny_mixtral(tmp_path_factory.mktemp("kv8-64"), hidden=128, heads=8, kv_heads=2, head_dim=64)


@pytest.fixture(scope="module")
def hd32(tmp_path_factory):  # 32 wide (one block a row): attention.c's by-group kernel
    from engine.sources.tiny_model import write_tiny_mixtral

    return write_tiny_mixtral(tmp_path_factory.mktemp("kv8-32"), hidden=128, heads=4, kv_heads=2, head_dim=32)


def model_of(folder, bits: int, dtype=torch.float32) -> MoEModel:
    ck = Checkpoint(folder)
    return MoEModel(ck, Placement.uniform(ck.dims.layers, ck.dims.experts, Tier.CPU16), torch.device("cpu"), dtype,
                    kv_bits=bits)


def test_a_row_is_codes_and_a_scale_a_block_within_half_a_step():
    x = torch.randn(3, 7, 128, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 2, 7)[:, None]
    x[0, 0, :32] = 0.0  # a block of zeros: scale 0, codes 0
    rows = torch.empty(3, 7, kv8.row_bytes(128), dtype=torch.uint8)
    kv8.pack(x, rows)
    assert kv8.row_bytes(128) == 136 and kv8.width_of(136) == 128
    codes = rows[..., :128].view(torch.int8).float().unflatten(-1, (4, 32))
    scale = rows[..., 128:].view(torch.float16).float()
    assert codes.abs().amax(-1).max() == 127 and codes.abs().max() <= 127
    y = kv8.unpack(rows)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert torch.equal(y[0, 0, :32], torch.zeros(32))
    step = scale.unsqueeze(-1).expand(-1, -1, -1, 32).flatten(-2)
    # half a step of the block's scale, and the fp16 scale's own rounding at the block's largest value
    assert ((y - x).abs() <= step * 0.5 + x.abs().amax(-1, keepdim=True) * 2 ** -10).all()
    assert torch.equal(kv8.unpack(rows, torch.bfloat16).float(), y.bfloat16().float())


def test_logits_stay_close_to_the_16_bit_caches(hd64):
    """A prompt of 300 (read in flash.c) and 11 decode steps, at 8 against 16 bits, fp32 and bf16 models.
    Measured (fp32): the largest logit change per position has median 0.015 (logits up to 2.1), 0.32 at
    one position (a route that flips to another expert), and the next-token KL 4e-5 nats."""
    ids = torch.randint(0, 320, (311,), generator=torch.Generator().manual_seed(4))
    for dtype in (torch.float32, torch.bfloat16):
        out = {}
        for bits in (16, 8):
            m = model_of(hd64, bits, dtype)
            cache = m.new_cache(400)
            got = [m.forward(ids[:300], cache, 0, all_logits=True)]
            got += [m.forward(ids[i:i + 1], cache, i) for i in range(300, 311)]
            out[bits] = torch.cat(got)
        diff = (out[8] - out[16]).abs().amax(-1)
        p, q = torch.log_softmax(out[16], -1), torch.log_softmax(out[8], -1)
        kl = (p.exp() * (p - q)).sum(-1).mean().item()
        assert diff.median().item() < 0.05 and kl < 1e-3, (dtype, diff.median().item(), kl)
        assert (out[8].argmax(-1) == out[16].argmax(-1)).float().mean() > 0.95


@pytest.mark.parametrize("which", ["hd64", "hd32"])
@pytest.mark.parametrize("path", [native.PATHS.index("portable C"), 2], ids=["c", "avx512"])
def test_the_native_decode_step_equals_the_torch_forward_on_an_8_bit_cache(request, which, path):
    """decode.c writes the same codes and scales as kv8.pack, and attention.c reads them to torch's
    dequantised rows' result: logits within fp32 rounding (measured 8e-7 of logits up to 2.2), the two
    caches byte for byte equal."""
    from engine.native import choice

    if not native.available():
        pytest.skip("no native library")
    active = native.lib().mdk_select_path(-1)
    if native.lib().mdk_select_path(path) < path:
        native.lib().mdk_select_path(active)
        pytest.skip("this CPU lacks that path")
    try:
        m = model_of(request.getfixturevalue(which), 8)
        assert choice.whole_step(m) and m.kv_dtype == torch.uint8
        ids = torch.randint(0, 320, (160,), generator=torch.Generator().manual_seed(1))
        outs, caches, step = [], [], m.native_step
        for use in (True, False):
            m.native_step = step if use else None
            cache = m.new_cache(200)
            m.forward(ids[:140], cache, 0)
            outs.append(torch.cat([m.forward(ids[i:i + 1], cache, i) for i in range(140, 160)]))
            caches.append(cache)
        m.native_step = step
    finally:
        native.lib().mdk_select_path(active)
    assert (outs[0] - outs[1]).abs().max().item() <= 1e-5 * outs[1].abs().max().item()
    for a, b in ((caches[0].k, caches[1].k), (caches[0].v, caches[1].v)):
        assert torch.equal(a[:, :, :160], b[:, :, :160])


def test_a_token_takes_about_half_the_bytes_and_the_planner_counts_what_the_cache_holds(hd64):
    bf16 = {bits: model_of(hd64, bits, torch.bfloat16).new_cache(64) for bits in (16, 8)}
    ck = Checkpoint(hd64)
    for bits, cache in bf16.items():
        assert cache.token_bytes == model_cost(ck.dims, torch.bfloat16, bits).per_token
        assert cache.nbytes == cache.token_bytes * 64
    assert bf16[8].token_bytes / bf16[16].token_bytes == int8_element_bytes() / 2 == 0.53125
    # Qwen3-30B-A3B: 48 layers x 4 kv heads x (128 + 128) values a token
    from types import SimpleNamespace

    from engine.planning.kv_reservation import cost_of

    qwen = SimpleNamespace(layer_attn=None, kv_shape=(4, 128, 128), decoder_layers=48, mixer=lambda i: "attention",
                           window=lambda i: None, state_bytes=lambda: 0, max_positions=40960)
    assert cost_of(qwen, 2, 1).per_token == 98_304 and cost_of(qwen, int8_element_bytes(), 1).per_token == 52_224


def test_auto_opens_about_twice_the_context_at_8_bits_where_memory_bounds_it(hd64):
    ck = Checkpoint(hd64)
    at = {bits: model_cost(ck.dims, torch.bfloat16, bits) for bits in (16, 8)}
    at = {bits: replace(c, max_positions=1 << 20) for bits, c in at.items()}  # a long model's own length
    room = 400 * 2**20
    auto = {bits: choose_length(c, room, 4 * room, "auto") for bits, c in at.items()}
    assert 1.8 < auto[8].ctx / auto[16].ctx < 1.9  # 2 / 1.0625 = 1.88, less the rounding to 1,024
    asked = {bits: choose_length(c, room, 4 * room, 16384) for bits, c in at.items()}
    assert asked[8].nbytes / asked[16].nbytes == 0.53125
    assert "(8-bit)" not in asked[16].line() and "(8-bit)" in asked[8].line()


def test_a_kept_cache_is_saved_and_restored_at_8_bits_and_a_16_bit_file_is_not_read_into_it(hd64, tmp_path):
    from types import SimpleNamespace

    from engine.kv.files import KVFiles, fingerprint

    ids = torch.randint(0, 320, (300,), generator=torch.Generator().manual_seed(3))
    m8, m16 = model_of(hd64, 8, torch.bfloat16), model_of(hd64, 16, torch.bfloat16)
    ck = m8.ckpt

    def ld(m):
        return SimpleNamespace(ckpt=ck, model=m)

    assert fingerprint(ld(m8)) != fingerprint(ld(m16))  # another format, another key
    files = {m: KVFiles(tmp_path / "kv", model="tiny", fingerprint=fingerprint(ld(m)), limit=1 << 30, min_tokens=32)
             for m in (m8, m16)}
    kept = {}
    for m in (m8, m16):
        cache = m.new_cache(512)
        m.forward(ids, cache, 0)
        cache.tokens = ids.tolist()
        assert files[m].save(f"chat:{m.kv_bits}", cache) is not None
        kept[m] = cache
    back = m8.new_cache(512)
    assert files[m8].restore(files[m8].find("chat:8"), back, 300, 0.0)
    assert back.tokens == ids.tolist()
    for a, b in ((back.k, kept[m8].k), (back.v, kept[m8].v)):
        assert torch.equal(a[:, :, :300], b[:, :, :300])
    nxt = torch.tensor([7])
    assert torch.equal(m8.forward(nxt, back, 300), m8.forward(nxt, kept[m8], 300))  # the same next step
    # a 16-bit file: not this model's (its key differs), and its tensors do not fit an 8-bit cache
    assert KVFiles(tmp_path / "kv", model="tiny", fingerprint=fingerprint(ld(m8))).find("chat:16") is None
    with pytest.raises(ValueError, match="this cache holds torch.uint8"):
        m8.new_cache(512).from_tensors(kept[m16].tokens, kept[m16].tensors())


def test_the_option_from_the_command_line_to_the_loaded_line(hd64, tiny, window_cache, capsys):
    from engine.runtime.client import Client
    from engine.protocol.sampling import SamplingParams
    from engine.tools.cli import build_parser, main

    p = build_parser()
    for cmd in (["chat"], ["bench"], ["serve"]):
        assert p.parse_args(cmd + ["--kv-bits", "8"]).kv_bits == 8
        assert p.parse_args(cmd).kv_bits == 16
    assert p.parse_args(["--kv-bits", "8"]).window_kv_bits == 8  # the window's start
    with pytest.raises(SystemExit) as e:
        main(["chat", "--kv-bits", "4"])
    assert e.value.code == 2 and "use 16 (the model's dtype) or 8" in capsys.readouterr().err
    c = Client()
    try:
        ev = c.load(str(hd64), placement="cpu", device="cpu", dtype="bf16", ctx=512, kv_bits=8)
        assert ev.context.line() == "512 tokens: 279 KB of keys and values (8-bit)"
        assert "keys and values 8-bit" in ev.description
        done = c.generate(prompt_ids=list(range(40)), params=SamplingParams(max_new_tokens=4))
        assert len(done.token_ids) == 4
        with pytest.raises(Exception, match="8-bit keys and values need rows of a multiple of 32 values; this "
                                            "model's are 16 wide: use 16"):
            c.load(str(tiny), placement="cpu", device="cpu", dtype="fp32", kv_bits=8)
    finally:
        c.close()


def test_a_format_other_than_16_or_8_is_refused_in_a_line(hd64):
    with pytest.raises(InputError, match="4 is not a keys-and-values format: use 16 or 8"):
        model_of(hd64, 4)


@pytest.mark.parametrize("family, widths", [
    ("qwen3_moe", dict(head_dim=32)),  # q/k norms
    ("qwen3_next", {}),  # attention layers among Gated DeltaNet ones (their state beside the rows)
    ("glm4_moe_lite", dict(kv_lora_rank=56, qk_rope_head_dim=8)),  # MLA: one 64-wide latent row a position
    ("gemma4", dict(head_dim=32, global_head_dim=64)),  # layers of two widths, rows of their own each
])
def test_every_kind_of_cache_stores_8_bit_rows(tmp_path, family, widths):
    """The torch forward's caches of other shapes at 8 bits: logits of a 40-token prompt and 8 decode
    steps near the 16-bit cache's (fp32 models, logits up to ~2: the largest change a position has median
    0.003-0.028, at most 0.093, Gemma 4 the most)."""
    from engine.sources.tiny_model import write_tiny_model

    folder = write_tiny_model(tmp_path / family, family, tokenizer=False, **widths)
    ids = torch.randint(0, 320, (48,), generator=torch.Generator().manual_seed(5))
    out = {}
    for bits in (16, 8):
        m = model_of(folder, bits)
        cache = m.new_cache(64)
        got = [m.forward(ids[:40], cache, 0, all_logits=True)] + [m.forward(ids[i:i + 1], cache, i) for i in range(40, 48)]
        out[bits] = torch.cat(got)
        if bits == 8:
            assert all(t.dtype == torch.uint8 for _, t in cache._rows())
    diff = (out[8] - out[16]).abs().amax(-1)
    assert diff.median().item() < 0.05 * out[16].abs().max().item(), diff
