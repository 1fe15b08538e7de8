"""Shared by several test modules (moved out of tests/test_gguf_write.py, which uses them too): SDIST, SDIST_ROOT."""
from __future__ import annotations
from pathlib import Path
FAMILIES = ["mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss"]
ARCH = {"mixtral": "llama", "qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "olmoe": "olmoe", "gpt_oss": "gpt-oss"}
COMMON = {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
          "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}
EXTRA = {
    "mixtral": {"ffn_norm.weight"},
    "qwen3_moe": {"ffn_norm.weight", "attn_q_norm.weight", "attn_k_norm.weight"},
    "olmoe": {"ffn_norm.weight", "attn_q_norm.weight", "attn_k_norm.weight"},
    "qwen2_moe": {"ffn_norm.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "ffn_gate_inp_shexp.weight",
                  "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"},
    "gpt_oss": {"post_attention_norm.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
                "attn_sinks.weight", "ffn_gate_inp.bias", "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias"},
}
TEXTS = ["hello world, this is a tiny model", "Café, naïve, 東京 🙂 0123456789 !?", "<|user|>\nhi</s>\n  two  spaces"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": "Yes."}, {"role": "user", "content": "東京?"}]


SDIST = Path("/work/peer/llama_cpp_python-0.3.36.tar.gz")


SDIST_ROOT = "llama_cpp_python-0.3.36/vendor/llama.cpp/"

