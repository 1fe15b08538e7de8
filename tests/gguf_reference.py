"""transformers' model on a GGUF file's own values (a helper module, not a test): gguf.quants.dequantize of
each tensor, mapped to transformers' parameters here independently of engine/files/gguf's names, for the
tests that hold the engine's GGUF path against it (test_gguf_model, test_gguf_codes)."""
from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as GT
from gguf import GGUFReader
from gguf.quants import dequantize


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


def ppl(model, ids: torch.Tensor) -> float:
    with torch.no_grad():
        logits = model(ids[None]).logits[0].float()
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])
    return float(torch.exp(-lp.mean()))
