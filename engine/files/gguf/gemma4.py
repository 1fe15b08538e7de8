"""Gemma 4's Mixture-of-Experts models in GGUF (llama.cpp's `gemma4`): the metadata as the Gemma4TextConfig the
engine sizes from (engine/families/gemma4.py, engine/files/model_config.py _sandwich; the names: engine/files/gguf/names.py
GEMMA4_LAYER), and the converter's steps for engine/files/gguf/writer.py (`sources`, `metadata`, `write_vocab`).

What llama.cpp's converter does (conversion/gemma.py Gemma4Model over Gemma3Model and TextModel; vendored in
llama-cpp-python 0.3.36, ggml-org/llama.cpp@0c1e57098):
- reads `model.language_model.` as `model.` and drops the vision and audio towers (TextModel.filter_tensors:
  vision_/audio_ names; they go to a separate mmproj file, Gemma4VisionAudioModel);
- no norm is shifted (Gemma4Model.norm_shift is 0: Gemma 4's RMSNorm multiplies by w, not 1 + w), no row is
  permuted, the embedding is not scaled (llama.cpp multiplies by sqrt(n_embd) itself); the embedding is cut
  to the tokenizer's length (Gemma3Model.modify_tensors: tokenizer.json's vocab + added tokens);
- names: input_layernorm -> attn_norm, post_attention_layernorm -> post_attention_norm,
  pre_feedforward_layernorm -> ffn_norm, post_feedforward_layernorm -> post_ffw_norm,
  pre_feedforward_layernorm_2 -> pre_ffw_norm_2, post_feedforward_layernorm_1 / _2 -> post_ffw_norm_1 / _2,
  layer_scalar -> layer_output_scale.weight [1], mlp.{gate,up,down}_proj -> ffn_{gate,up,down} (the dense MLP
  beside the experts), router.proj -> ffn_gate_inp.weight, router.scale -> ffn_gate_inp.scale,
  router.per_expert_scale -> ffn_down_exps.scale, experts.gate_up_proj [E, 2I, D] -> ffn_gate_up_exps.weight
  (gate rows first, as is), experts.down_proj -> ffn_down_exps.weight; the global layers' (keys are values)
  attn_v is absent, as in the release;
- one extra tensor, rope_freqs.weight [global head dim / 2] (generate_extra_tensors): 1.0 for the rotated
  pairs of the proportional rope, 1e30 for the others (llama.cpp then leaves them unrotated); only the
  global layers use it;
- metadata beyond TextModel's: head_count_kv per layer (num_key_value_heads on sliding layers,
  num_global_key_value_heads on global ones), key_length / value_length = global_head_dim,
  key_length_swa / value_length_swa = head_dim, attention.sliding_window_pattern (a bool a layer: sliding),
  sliding_window, rope.freq_base (global theta) and rope.freq_base_swa (sliding theta),
  rope.dimension_count = global_head_dim (proportional rope via rope_freqs), rope.dimension_count_swa =
  head_dim x the sliding partial factor, expert_feed_forward_length, feed_forward_length (the dense MLP),
  final_logit_softcapping, attention.shared_kv_layers, embedding_length_per_layer_input (0: no per-layer
  embeddings), expert_used_count (num_experts_per_tok, else top_k_experts).
- the vocabulary (Gemma4Model.set_vocab): gguf's LlamaHfVocab over tokenizer.json (byte-fallback BPE),
  tokenizer.ggml.model "gemma4", scores -1000, the chat parser's tokens USER_DEFINED, no space prefix, BOS added.
Nothing says keys-are-values: llama.cpp (src/models/gemma4.cpp) uses k for v where attn_v is absent; so does
Mixdesk's reader (attention_k_eq_v from the global layers' missing attn_v).
Files Mixdesk refuses: per-layer embeddings (E2B/E4B), shared kv layers, double-wide MLPs (dense Gemma 4s).
"""
from __future__ import annotations

import torch

from ...protocol.errors import ModelError

ARCH = "gemma4"
FAR = 1e30  # rope_freqs' factor for a pair left unrotated

# --- reading: the metadata as Gemma4TextConfig's fields ------------------------------------------------------

def _array(f, name: str, layers: int, kind):
    """A per-layer metadata array (or one value for every layer) as a list of `layers` values."""
    full = f"{ARCH}.{name}"
    v = f.get(full)
    if v is None:
        return None
    v = list(v) if isinstance(v, (list, tuple)) else [v] * layers
    if len(v) != layers or any(not isinstance(x, kind) for x in v):
        raise ModelError(f.path, f"metadata '{full}' must hold one {kind.__name__} for each of the {layers} layers "
                         f"('{ARCH}.block_count')")
    return v


def rotated_pairs(f, head_dim: int) -> int:
    """How many of a global head's pairs rope_freqs leaves rotated (factor 1; the rest 1e30), llama.cpp's
    proportional rope; every pair when the file has no rope_freqs."""
    t = f.tensors.get("rope_freqs.weight")
    if t is None:
        return head_dim // 2
    if t.shape != (head_dim // 2,):
        raise ModelError(f.path, f"tensor 'rope_freqs.weight' has shape {list(t.shape)}; the global layers' heads "
                         f"of {head_dim} ('{ARCH}.attention.key_length') need {head_dim // 2}")
    v = _read_f32(f, t)
    n = int((v == 1.0).sum())
    if not torch.all(v[:n] == 1.0) or not torch.all(v[n:] >= 1e20):
        raise ModelError(f.path, "tensor 'rope_freqs.weight' is not a proportional rope's (1.0 for the first pairs, "
                         "1e30 for the rest); Mixdesk runs Gemma 4's")
    return n


def _read_f32(f, t) -> torch.Tensor:
    from gguf import GGMLQuantizationType as GT

    if t.qtype != GT.F32:
        raise ModelError(f.path, f"tensor 'rope_freqs.weight' is {t.qtype.name}; the converter writes it F32")
    raw = torch.empty(t.rows, t.row_bytes, dtype=torch.uint8)
    return f.read_bytes(t, 0, t.rows * t.row_bytes, raw).reshape(-1).view(torch.float32)


def config_dict(f, key, embd) -> dict:
    """Gemma4TextConfig's raw dict from a gemma4 file's metadata and tensors (config.py's `key` reads
    {arch}.name as one value). Inconsistent metadata, or a Gemma 4 Mixdesk does not run, is one ModelError
    naming the key."""
    path, a, t = f.path, ARCH, f.tensors
    layers = key("block_count")
    for name in ("embedding_length_per_layer_input", "attention.shared_kv_layers"):
        if key(name, required=False):
            raise ModelError(path, f"metadata '{a}.{name}' is {key(name)}; Mixdesk runs Gemma 4's Mixture-of-Experts "
                             "model (no per-layer embeddings, no shared kv layers)")
    experts = key("expert_count", required=False) or 0
    if experts < 1 or "blk.0.ffn_gate_inp.weight" not in t:
        raise ModelError(path, f"is a dense Gemma 4 ('{a}.expert_count' is {experts}); Mixdesk runs Mixture-of-"
                         "Experts models: Gemma 4 26B-A4B")
    swa = _array(f, "attention.sliding_window_pattern", layers, bool)
    if swa is None:
        raise ModelError(path, f"lacks the metadata '{a}.attention.sliding_window_pattern'")
    kv = _array(f, "attention.head_count_kv", layers, int)
    heads = key("attention.head_count")
    kv = kv or [heads] * layers
    if any(x < 1 or heads % x for x in kv):
        raise ModelError(path, f"metadata '{a}.attention.head_count_kv' ({kv}) must divide the {heads} heads")
    kinds = ["sliding_attention" if s else "full_attention" for s in swa]
    full = [i for i, s in enumerate(swa) if not s]
    slide = [i for i, s in enumerate(swa) if s]
    for group, what in ((full, "global"), (slide, "sliding")):
        if len({kv[i] for i in group}) > 1:
            raise ModelError(path, f"metadata '{a}.attention.head_count_kv' differs between the {what} layers "
                             f"({[kv[i] for i in group]}); Gemma 4's are alike")
    head_full, head_swa = key("attention.key_length"), key("attention.key_length_swa")
    for name, width in (("attention.value_length", head_full), ("attention.value_length_swa", head_swa)):
        if key(name, required=False, default=width) != width:
            raise ModelError(path, f"metadata '{a}.{name}' is {key(name)}; Gemma 4's values are as wide as its keys")
    rot_swa = key("rope.dimension_count_swa", required=False) or head_swa
    if rot_swa != head_swa:
        raise ModelError(path, f"metadata '{a}.rope.dimension_count_swa' is {rot_swa}; Mixdesk runs Gemma 4's "
                         f"sliding layers with rope over the whole head ({head_swa})")
    rot_full = key("rope.dimension_count", required=False) or head_full
    if rot_full != head_full:
        raise ModelError(path, f"metadata '{a}.rope.dimension_count' is {rot_full}; the converter writes the global "
                         f"head's {head_full} (its proportional rope is in rope_freqs.weight)")
    pairs = rotated_pairs(f, head_full)
    kv_full = kv[full[0]] if full else kv[0]
    k_eq_v = bool(full) and all(f"blk.{i}.attn_v.weight" not in t for i in full)
    softcap = key("final_logit_softcapping", float, required=False)
    rope_full = {"rope_type": "proportional", "partial_rotary_factor": 2 * pairs / head_full,
                 "rope_theta": key("rope.freq_base", float, default=1000000.0)}
    rope_swa = {"rope_type": "default", "rope_theta": key("rope.freq_base_swa", float, default=10000.0)}
    return {
        "model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"],
        "num_hidden_layers": layers, "hidden_size": key("embedding_length"), "num_attention_heads": heads,
        "num_key_value_heads": kv[slide[0]] if slide else kv[0], "num_global_key_value_heads": kv_full,
        "head_dim": head_swa, "global_head_dim": head_full, "attention_k_eq_v": k_eq_v, "layer_types": kinds,
        "sliding_window": key("attention.sliding_window"), "intermediate_size": key("feed_forward_length"),
        "enable_moe_block": True, "num_experts": experts, "top_k_experts": key("expert_used_count"),
        "moe_intermediate_size": key("expert_feed_forward_length"),
        "vocab_size": embd.shape[0] if len(embd.ne) == 2 else -1,
        "max_position_embeddings": key("context_length"),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", float),
        "final_logit_softcapping": softcap or None, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0, "use_double_wide_mlp": False,
        "attention_bias": False, "tie_word_embeddings": "output.weight" not in t,
        "rope_parameters": {"full_attention": rope_full, "sliding_attention": rope_swa},
    }


# --- writing: the converter's steps --------------------------------------------------------------------------

TOWERS = ("vision_", "audio_", "vision.", "audio.")  # those of TextModel.filter_tensors' markers Gemma 4's towers hit


def skipped(name: str) -> bool:
    """The tensors the text model's conversion leaves out: the vision and audio towers and their embedders."""
    return any(m in name for m in TOWERS)


def gguf_name(name: str) -> str | None:
    """The converter's GGUF name of a text-model tensor (its name already without `language_model.`)."""
    import engine.files.gguf.names as names  # (as a module: no edge to the package)

    name = name.removesuffix(".weight") + ".weight" if ".experts." in name else name
    m = names._LAYER.match(name)
    if m and m[2] in ("experts.gate_up_proj.weight", "experts.down_proj.weight"):
        return f"blk.{m[1]}.ffn_{'gate_up' if 'gate_up' in m[2] else 'down'}_exps.weight"
    return names.gguf_name(name, ARCH)


def embedding_rows(folder) -> int | None:
    """Gemma3Model.modify_tensors' cut of token_embd: the tokenizer's length (tokenizer.json's vocab and
    added tokens; a sentencepiece tokenizer.model is not read here: None)."""
    import json
    from pathlib import Path

    folder = Path(folder)
    if (folder / "tokenizer.model").is_file() or not (folder / "tokenizer.json").is_file():
        return None
    tj = json.loads((folder / "tokenizer.json").read_text())
    return len(tj["model"]["vocab"]) + len(tj["added_tokens"])


def sources(folder, srcs: list, hp: dict) -> list:
    """[(GGUF name, shape, load)] in the converter's order: rope_freqs first (generate_extra_tensors), then the
    text model's tensors as stored, renamed; the embedding cut to the tokenizer's length."""
    head_full = full_head_dim(hp)
    rope = hp["rope_parameters"]["full_attention"]
    if rope.get("rope_type") != "proportional":
        raise ModelError(folder, f"the global layers' rope is {rope.get('rope_type')!r}; llama.cpp's converter "
                         "asserts Gemma 4's proportional rope")
    pairs = int(head_full * rope["partial_rotary_factor"] / 2)
    freqs = torch.tensor([1.0] * pairs + [FAR] * (head_full // 2 - pairs), dtype=torch.float32)
    out = [("rope_freqs.weight", tuple(freqs.shape), lambda: freqs)]
    rows = embedding_rows(folder)
    for n, s, load in srcs:
        if skipped(n):
            continue
        n = n.replace("language_model.", "")
        g = gguf_name(n)
        if g is None:
            raise ModelError(folder, f"tensor {n} has no GGUF name for gemma4")
        if g == "token_embd.weight" and rows is not None and rows < s[0]:
            s, load = (rows, *s[1:]), (lambda f, r: lambda: f()[:r])(load, rows)
        out.append((g, tuple(s), load))
    return out


def full_head_dim(hp: dict) -> int:
    """global_head_dim, or (as the converter) the first global layer's head_dim in per_layer_config."""
    if hp.get("global_head_dim") is not None:
        return int(hp["global_head_dim"])
    kinds = hp.get("layer_types", [])
    for i, c in (hp.get("per_layer_config") or {}).items():
        if int(i) < len(kinds) and kinds[int(i)] == "full_attention" and "head_dim" in c:
            return int(c["head_dim"])
    raise ModelError("config.json", "Gemma 4 without global_head_dim: the converter asserts one")


def _full_kv(hp: dict):
    if hp.get("num_global_key_value_heads") is not None:
        return hp["num_global_key_value_heads"]
    kinds = hp.get("layer_types", [])
    for i, c in (hp.get("per_layer_config") or {}).items():
        if int(i) < len(kinds) and kinds[int(i)] == "full_attention" and "num_key_value_heads" in c:
            return c["num_key_value_heads"]
    return None


def check_source(folder, hp: dict) -> None:
    """What Mixdesk's reader refuses, refused before writing (per-layer embeddings, shared kv, double-wide MLPs,
    a dense Gemma 4)."""
    if hp.get("hidden_size_per_layer_input") or hp.get("num_kv_shared_layers") or hp.get("use_double_wide_mlp"):
        raise ModelError(folder, "a Gemma 4 with per-layer embeddings, shared kv layers or a double-wide MLP "
                         "(E2B/E4B); Mixdesk writes Gemma 4's Mixture-of-Experts model")
    if not hp.get("enable_moe_block"):
        raise ModelError(folder, "a dense Gemma 4 (enable_moe_block is false); Mixdesk writes Mixture-of-Experts models")


def swa_theta(w, hp: dict) -> None:
    """TextModel's rope_freq_base_swa (right after rope_freq_base)."""
    theta = (hp.get("rope_parameters") or {}).get("sliding_attention", {}).get("rope_theta")
    if theta is not None:
        w.add_rope_freq_base_swa(theta)


def metadata(w, hp: dict) -> None:
    """Gemma3Model.set_gguf_parameters, then Gemma4Model's, after TextModel's (keys set twice keep their place
    and take the later value, as GGUFWriter does; its warning for each is silenced here)."""
    import logging

    log = logging.getLogger("gguf.gguf_writer")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        _metadata(w, hp)
    finally:
        log.setLevel(level)


def _metadata(w, hp: dict) -> None:
    rope = hp["rope_parameters"]
    w.add_context_length(hp.get("max_position_embeddings", 131072))
    w.add_head_count(hp.get("num_attention_heads", 8))
    w.add_layer_norm_rms_eps(hp.get("rms_norm_eps", 1e-6))
    w.add_key_length(hp.get("head_dim", 256))
    w.add_value_length(hp.get("head_dim", 256))
    w.add_rope_freq_base(rope.get("full_attention", rope).get("rope_theta", 1_000_000.0))
    if hp.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(hp["final_logit_softcapping"])
    if hp.get("sliding_window_pattern") != 1:
        w.add_sliding_window(hp["sliding_window"])
    w.add_head_count_kv(hp.get("num_key_value_heads", 4))
    w.add_shared_kv_layers(hp["num_kv_shared_layers"])
    w.add_embedding_length_per_layer_input(hp.get("hidden_size_per_layer_input") or 0)
    swa = [t == "sliding_attention" for t in hp["layer_types"]]
    w.add_sliding_window_pattern(swa)
    head_full, head_swa = full_head_dim(hp), hp["head_dim"]
    w.add_key_length(head_full)
    w.add_value_length(head_full)
    w.add_key_length_swa(head_swa)
    w.add_value_length_swa(head_swa)
    ffn = next((hp[k] for k in ("expert_intermediate_size", "moe_intermediate_size") if k in hp), None)
    if ffn is not None:
        w.add_expert_feed_forward_length(ffn)
    kv_full, kv_swa = _full_kv(hp), hp.get("num_key_value_heads")
    if kv_full is not None and kv_swa is not None:
        w.add_head_count_kv([kv_swa if s else kv_full for s in swa])
    w.add_rope_dimension_count(int(head_full))
    w.add_rope_dimension_count_swa(int(head_swa * rope.get("partial_rotary_factor", 1.0)))  # (the nested dict: 1.0)


VISIBLE = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>'}


def write_vocab(w, folder) -> bool:
    """Gemma4Model.set_vocab: gguf's LlamaHfVocab over tokenizer.json (a byte-fallback BPE), tokenizer model
    "gemma4", its scores and types (the chat parser's tokens USER_DEFINED), SpecialVocab with merges, no space
    prefix, a BOS added. False (nothing written) where tokenizer.json is not such a tokenizer: the converter
    fails there; engine/files/gguf/writer.py then writes the byte-level BPE tokenizer as TextModel does."""
    import gguf

    try:
        vocab = gguf.LlamaHfVocab(folder)
    except (FileNotFoundError, TypeError):
        return False
    tokens, scores, toktypes = [], [], []
    for text, score, toktype in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        toktypes.append(gguf.TokenType.USER_DEFINED if text.decode() in VISIBLE else toktype)
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(toktypes)
    gguf.SpecialVocab(folder, load_merges=True).add_to_gguf(w)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)
    return True
