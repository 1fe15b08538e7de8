"""GLM GGUF files for tests/test_gguf_glm*.py: tiny GLM-4.5 (`glm4_moe`, llama.cpp's `glm4moe`) and
GLM-4.7-Flash (`glm4_moe_lite`, llama.cpp's `deepseek2`) models (engine/sources/tiny_model.py: 3 layers,
the first dense, 4 experts in 2 groups) fit for our writer and llama.cpp's converter, and the file helpers.

- The tokenizer has GLM's special tokens ([gMASK], <|user|>, <|endoftext|>, <|observation|>: the
  converter's _set_vocab_glm needs them) and is trained 16 tokens short of the vocabulary.
- The RMSNorm weights (ones at init) are randomised, so a norm read in the wrong place shows.
- GLM-4.7-Flash's config.json carries first_k_dense_replace as the release does (the converter writes
  leading_dense_block_count from it, not from mlp_layer_types), and scoring_func "sigmoid": without an
  expert_gating_func key llama.cpp routes a deepseek2 file with softmax unless it has GLM-4.7-Flash's 47
  layers and 154,880 tokens, which a tiny model has not (`gating=False` leaves it out)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as GT

from engine.sources.tiny_model import CHAT_TEMPLATE, CORPUS, write_tiny_model

ARCH = {"glm4_moe": "glm4moe", "glm4_moe_lite": "deepseek2"}
GLM_SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                "<|assistant|>", "<|observation|>"]


def write_glm_tokenizer(folder: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=GLM_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))


def tiny(folder: Path, family: str, seed: int = 3, vocab: int = 320, gating: bool = True, **extra) -> Path:
    from safetensors.torch import load_file, save_file

    write_tiny_model(folder, family, layers=3, vocab=vocab, seed=seed, tokenizer=False, **extra)
    write_glm_tokenizer(folder, vocab - 16)
    cfg = json.loads((folder / "config.json").read_text())
    if family == "glm4_moe_lite":
        cfg["first_k_dense_replace"] = 1
        if gating:
            cfg["scoring_func"] = "sigmoid"
    cfg.update(bos_token_id=None, eos_token_id=0, pad_token_id=0)  # <|endoftext|>
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    path = folder / "model.safetensors"
    sd = load_file(str(path))
    g = torch.Generator().manual_seed(seed)
    for name, t in sd.items():
        if name.endswith(("norm.weight", "layernorm.weight")):
            sd[name] = 1 + 0.3 * torch.randn(t.shape, generator=g)
    save_file(sd, str(path), metadata={"format": "pt"})
    return folder


def with_mtp_block(ts: list, last: int) -> list:
    """The block a default (MTP) conversion adds after the last layer `last`: a whole MoE layer (here
    layer `last`'s tensors) and its nextn tensors."""
    extra = [(n.replace(f"blk.{last}.", f"blk.{last + 1}."), d, q) for n, d, q in ts if n.startswith(f"blk.{last}.")]
    d = np.ones(64, dtype=np.float32)
    extra += [(f"blk.{last + 1}.nextn.eh_proj.weight", np.zeros((64, 128), dtype=np.float32), GT.F32),
              (f"blk.{last + 1}.nextn.enorm.weight", d, GT.F32), (f"blk.{last + 1}.nextn.hnorm.weight", d, GT.F32),
              (f"blk.{last + 1}.nextn.shared_head_norm.weight", d, GT.F32)]
    return ts + extra


def with_kv_b(ts: list) -> list:
    """A deepseek2 file as converters before the kv_b split wrote it: attn_kv_b [H (N + V), R] as released
    instead of attn_k_b and attn_v_b (key_length / value_length then the heads': rewrite's kv)."""
    by = {n: (d, q) for n, d, q in ts}
    out = []
    for n, d, q in ts:
        if n.endswith("attn_v_b.weight"):
            continue
        if n.endswith("attn_k_b.weight"):
            k_b = torch.from_numpy(np.asarray(d, dtype=np.float32))  # [H, R, N]
            v_b = torch.from_numpy(np.asarray(by[n.replace("attn_k_b", "attn_v_b")][0], dtype=np.float32))
            kv_b = torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(-1, k_b.shape[1])
            out.append((n.replace("attn_k_b", "attn_kv_b"), kv_b.numpy(), GT.F32))
            continue
        out.append((n, d, q))
    return out
