"""A Hugging Face model folder, validated up front and read lazily, expert by expert.

Only safetensors are read: a pickle checkpoint is refused, never unpickled, and no remote code runs.
Every problem becomes one ModelError naming the file and what is wrong with it.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from ..protocol.errors import ModelError
from ..families import FAMILIES, SUPPORTED_MODEL_TYPES
from . import fused_experts as fused
from ..layers import shapes as layer_shapes
from .model_config import (MAX_JSON_BYTES, Dims, check_config, dims_from_config,  # noqa: F401 (re-exported)
                           hf_config)
from .model_files import check_inside, check_links
from .safetensors_file import DTYPES, SafetensorsFile, regular_file

log = logging.getLogger(__name__)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# Tensor-name endings that give away a pre-quantised checkpoint, and the format each belongs to.
QUANT_MARKERS = {
    ".qweight": "GPTQ/AWQ",
    ".qzeros": "GPTQ/AWQ",
    ".g_idx": "GPTQ",
    ".absmax": "bitsandbytes",
    ".quant_state.bitsandbytes__nf4": "bitsandbytes",
    ".quant_state.bitsandbytes__fp4": "bitsandbytes",
    ".SCB": "bitsandbytes (8-bit)",
    ".W_q": "HQQ",
}
QUANT_METHOD_NAMES = {"gptq": "GPTQ", "awq": "AWQ", "bitsandbytes": "bitsandbytes", "hqq": "HQQ",
                      "aqlm": "AQLM", "exl2": "EXL2", "fp8": "FP8", "compressed-tensors": "compressed-tensors"}


def expert_key(layer: int, expert: int, w: str, d: Dims | None = None) -> str:
    """The checkpoint name of expert (layer, expert)'s w1 (gate), w2 (down) or w3 (up)."""
    if d is None:
        return FAMILIES["mixtral"].expert_key(layer, expert, w)
    return d.adapter.expert_key(d.decoder(layer), expert, w)


def dense_shapes(d: Dims) -> dict[str, tuple[int, ...]]:
    """Every non-expert tensor the model needs, with its shape."""
    s = {"model.embed_tokens.weight": (d.vocab, d.hidden), "model.norm.weight": (d.hidden,)}
    if not d.tie_embeddings:
        s["lm_head.weight"] = (d.vocab, d.hidden)
    fam = d.adapter
    for l in range(d.decoder_layers):
        s.update(layer_shapes(d, l))  # the layer's norms and its mixer's tensors (engine/layers)
    for l in range(d.dense_first):  # leading layers with a dense MLP (GLM-4.5)
        s[fam.dense_ffn_key(l, "w1")] = s[fam.dense_ffn_key(l, "w3")] = (d.dense_ffn, d.hidden)
        s[fam.dense_ffn_key(l, "w2")] = (d.hidden, d.dense_ffn)
    for l in map(d.decoder, range(d.layers)):  # the layers with experts
        if d.router_bias:
            s[fam.router_key(l, bias=True)] = (d.experts,)
        if d.router_kind == "sigmoid_groups":
            s[fam.correction_key(l)] = (d.experts,)
        if d.router_kind == "gemma":  # its router's own scale [D] and per-expert scale [E]
            s[fam.block(l) + "router.scale"], s[fam.block(l) + "router.per_expert_scale"] = (d.hidden,), (d.experts,)
        if d.parallel_ffn:  # the dense MLP beside the experts (Gemma 4)
            s[fam.dense_ffn_key(l, "w1")] = s[fam.dense_ffn_key(l, "w3")] = (d.parallel_ffn, d.hidden)
            s[fam.dense_ffn_key(l, "w2")] = (d.hidden, d.parallel_ffn)
        s[fam.router_key(l)] = (d.experts, d.hidden)
        if d.shared_ffn:
            s[fam.shared_key(l, "w1")] = s[fam.shared_key(l, "w3")] = (d.shared_ffn, d.hidden)
            s[fam.shared_key(l, "w2")] = (d.hidden, d.shared_ffn)
            if d.shared_gated:
                s[fam.shared_key(l, "gate")] = (1, d.hidden)
    return s


def expert_shapes(d: Dims, mxfp4: bool = False) -> dict[str, tuple[int, ...]]:
    if d.adapter.fused_experts:
        return fused.shapes(d, mxfp4)
    s = {}
    key = d.adapter.expert_key
    for l in map(d.decoder, range(d.layers)):
        for e in range(d.experts):
            s[key(l, e, "w1")] = (d.ffn, d.hidden)
            s[key(l, e, "w2")] = (d.hidden, d.ffn)
            s[key(l, e, "w3")] = (d.ffn, d.hidden)
    return s




def _read_json(path: Path) -> dict:
    regular_file(path)
    if path.stat().st_size > MAX_JSON_BYTES:
        raise ModelError(path, f"is larger than {MAX_JSON_BYTES >> 20} MB; it is not a model's JSON file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(path, "is missing") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(path, f"is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelError(path, "is not a JSON object")
    return data


class Checkpoint:
    """Open and validate a model folder; read tensors on demand. Never writes into the folder."""

    is_gguf = False  # (files/model_checkpoint.py)

    def __init__(self, folder: str | Path):
        self.folder = Path(folder).expanduser()
        if self.folder.is_file():
            if self.folder.suffix in PICKLE_SUFFIXES:
                raise ModelError(self.folder, _pickle_refusal())
            raise ModelError(self.folder, "is a file; give the model's folder (with config.json and *.safetensors)")
        if not self.folder.is_dir():
            raise ModelError(self.folder, "does not exist or is not a folder")
        self.config_path = self.folder / "config.json"
        self._check_files()
        self.raw_config = _read_json(self.config_path)
        self._check_model_type()
        check_config(self.raw_config, self.config_path)
        self.config = self._hf_config()
        self.dims = dims_from_config(self.config, self.config_path)
        self.files = self._open_weights()
        self.where: dict[str, SafetensorsFile] = {}
        skipped: dict[str, int] = {}
        for f in self.files:
            names = {}  # the engine's name -> the file's (a VLM release's language model read as "model.")
            for name, info in f.tensors.items():
                ours = self.family.internal_name(name)
                if ours is not None and _layer_of(ours) >= self.dims.decoder_layers:
                    ours = None  # a layer past num_hidden_layers: a multi-token-prediction layer (GLM-4.5)
                    skipped["mtp."] = skipped.get("mtp.", 0) + 1
                    continue
                if ours is None:
                    part = next(p for p in self.family.skipped if name.startswith(p))
                    skipped[part] = skipped.get(part, 0) + 1
                else:
                    names[ours] = info
            if not self.family.fused_experts:  # 3-D per-layer expert tensors: named per expert (families/fused.py)
                names = fused.split_fused(names, self.family)
            if names.keys() != f.tensors.keys():
                f.tensors = names
            for name in f.tensors:
                self.where[name] = f
        self.skipped_note = _skipped_note(skipped)
        if self.skipped_note:
            log.warning("%s: %s", self.folder.name, self.skipped_note)
        self._check_quantised()
        self.expected = {**dense_shapes(self.dims), **expert_shapes(self.dims, self.mxfp4)}
        self._check_tensors()
        # the experts' 16-bit source: MXFP4 is exact in bf16 (engine/files/fused_experts.py)
        self.dtype = torch.bfloat16 if self.mxfp4 else DTYPES[self.info(self.expert_key(0, 0, "w1")).dtype]

    # ---- validation -------------------------------------------------------------------------
    def _check_files(self) -> None:
        """Every entry leads inside the folder; every file the engine or the tokenizer may open is
        a regular file."""
        check_links(self.folder)
        for p in self.folder.iterdir():
            if p.suffix in (".json", ".safetensors", ".jinja", ".model", ".txt") or p.name.startswith("tokenizer"):
                if not p.is_dir():
                    regular_file(p)

    def _check_model_type(self) -> None:
        mt = self.raw_config.get("model_type")
        if mt in FAMILIES and not FAMILIES[mt].runs:
            raise ModelError(self.config_path, f"is a {FAMILIES[mt].name} model; Mixdesk plans it from its config "
                             "(mixdesk plan --config-only) but does not run its weights yet")
        if mt not in SUPPORTED_MODEL_TYPES:
            names = ", ".join(dict.fromkeys(f"{f.name} ({t.removesuffix('_text')})" for t, f in FAMILIES.items()
                                            if f.runs))
            raise ModelError(self.config_path, f"model_type is {mt!r}; Mixdesk runs these Mixture-of-Experts "
                             f"families: {names}")
        self.family = FAMILIES[mt]
        qc = self.raw_config.get("quantization_config")
        # MXFP4 experts, as gpt-oss ships: read (engine/files/fused_experts.py); any other format is refused
        self.mxfp4 = isinstance(qc, dict) and str(qc.get("quant_method", "")).lower() == "mxfp4" and \
            self.family.fused_experts
        if isinstance(qc, dict) and not self.mxfp4:
            method = str(qc.get("quant_method", "unknown"))
            raise ModelError(self.config_path, _quant_refusal(QUANT_METHOD_NAMES.get(method.lower(), method)))

    def _hf_config(self):
        return hf_config(self.raw_config, self.config_path)

    def _open_weights(self) -> list[SafetensorsFile]:
        index = self.folder / "model.safetensors.index.json"
        single = self.folder / "model.safetensors"
        if index.exists():
            weight_map = _read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ModelError(index, "has no weight_map")
            bad = next((k for k, v in weight_map.items() if not isinstance(v, str) or not v), None)
            if bad is not None:
                raise ModelError(index, f"maps tensor '{bad}' to {weight_map[bad]!r}, not to a file name")
            names = sorted(set(weight_map.values()))
            for n in names:
                check_inside(self.folder, self.folder / n, index)
                if not (self.folder / n).exists():
                    raise ModelError(self.folder / n, f"is missing (listed in {index.name})")
                regular_file(self.folder / n)
            self.index_map = weight_map
            return [SafetensorsFile(self.folder / n) for n in names]
        self.index_map = None
        if single.exists():
            return [SafetensorsFile(check_inside(self.folder, single))]
        shards = sorted(self.folder.glob("*.safetensors"))
        if shards:
            return [SafetensorsFile(check_inside(self.folder, p)) for p in shards]
        pickles = [p for p in self.folder.iterdir() if p.suffix in PICKLE_SUFFIXES]
        if pickles:
            raise ModelError(pickles[0], _pickle_refusal())
        raise ModelError(self.folder, "holds no .safetensors weights")

    def _check_quantised(self) -> None:
        for name, f in self.where.items():
            for marker, fmt in QUANT_MARKERS.items():
                if name.endswith(marker):
                    raise ModelError(f.path, _quant_refusal(fmt) + f" (tensor '{name}')")

    def _check_tensors(self) -> None:
        for name, shape in self.expected.items():
            f = self.where.get(name)
            if f is None:
                where = self.folder / "model.safetensors.index.json" if self.index_map else self.files[0].path
                if self.index_map and name in self.index_map:
                    where = self.folder / self.index_map[name]
                raise ModelError(where, f"is missing tensor '{name}'")
            got = f.tensors[name].shape
            if tuple(got) != shape:
                raise ModelError(
                    f.path,
                    f"tensor '{name}' has shape {list(got)} but config.json implies {list(shape)}",
                )
            packed = name.endswith(("_blocks", "_scales"))  # MXFP4's bytes; everything else is a float
            if (f.tensors[name].dtype == "U8") != packed:
                raise ModelError(f.path, f"tensor '{name}' has dtype {f.tensors[name].dtype}; Mixdesk reads 16- "
                                 "and 32-bit float checkpoints (BF16, F16, F32), and MXFP4 experts (U8)")

    # ---- reading ----------------------------------------------------------------------------
    def expert_key(self, layer: int, expert: int, w: str) -> str:
        return self.family.expert_key(self.dims.decoder(layer), expert, w)

    def info(self, name: str):
        return self.where[name].tensors[name]

    def read(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.where[name].read(name, out)

    def view(self, name: str) -> torch.Tensor:
        """The tensor where its file is mapped, read-only, no copy (engine/files/safetensors_file.py)."""
        return self.where[name].view(name)

    def read_rows(self, name: str, first: int, count: int) -> torch.Tensor:
        """Rows of a tensor's first dimension (one expert of a fused layer tensor)."""
        return self.where[name].read_rows(name, first, count)

    def expert_nbytes(self) -> int:
        """Bytes of one expert at the checkpoint's precision."""
        if self.family.fused_experts:
            return sum(self.info(n).nbytes for n in expert_shapes(self.dims, self.mxfp4)
                       if n.startswith("model.layers.0.")) // self.dims.experts
        return sum(self.info(self.expert_key(0, 0, w)).nbytes for w in ("w1", "w2", "w3"))

    def dense_nbytes(self) -> int:
        return sum(self.info(n).nbytes for n in dense_shapes(self.dims))

    def load_tokenizer(self):
        """The tokenizer, which must carry a chat template (Mixdesk is a chat app)."""
        from transformers import AutoTokenizer

        has_files = any((self.folder / n).exists() for n in ("tokenizer.json", "tokenizer.model", "vocab.json"))
        if not has_files:
            raise ModelError(self.folder, "has no tokenizer (tokenizer.json or tokenizer.model)")
        try:
            tok = AutoTokenizer.from_pretrained(str(self.folder), local_files_only=True)
        except Exception as e:
            raise ModelError(self.folder / "tokenizer.json", f"could not be loaded: {e}") from None
        if not getattr(tok, "chat_template", None):
            raise ModelError(
                self.folder / "tokenizer_config.json",
                "has no chat template; add one (tokenizer_config.json 'chat_template' or chat_template.jinja)",
            )
        return tok

    def eos_token_ids(self, tokenizer) -> set[int]:
        ids: set[int] = set()
        gen = self.folder / "generation_config.json"
        for source in (_read_json(gen) if gen.exists() else {}, self.raw_config):
            v = source.get("eos_token_id")
            ids.update(v if isinstance(v, list) else [v] if isinstance(v, int) else [])
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        return ids

    def find_damage(self) -> str | None:
        """After NaN or Inf scores: what in the files explains them. A safetensors tensor's values are the
        weights themselves, with no scales of their own to check: None."""
        return None

    def close(self) -> None:
        for f in self.files:
            f.close()


def _layer_of(name: str) -> int:
    """The decoder layer a tensor belongs to (-1: none)."""
    if name.startswith("model.layers."):
        head = name[13:].split(".", 1)[0]
        if head.isdigit():
            return int(head)
    return -1


def _skipped_note(skipped: dict[str, int]) -> str:
    """One sentence on the parts of the checkpoint Mixdesk does not run (said once, at load)."""
    if not skipped:
        return ""
    what = {"model.visual.": "the vision tower", "model.vision_tower.": "the vision tower",
            "model.embed_vision.": "the vision tower", "model.audio_tower.": "the audio tower",
            "model.embed_audio.": "the audio tower"}
    parts = sorted({what.get(p, "the multi-token-prediction head") for p in skipped},
                   key=lambda w: ("vision" not in w, "audio" not in w))
    n = sum(skipped.values())
    return (f"{' and '.join(parts)} ({n} tensors) {'are' if len(parts) > 1 else 'is'} not run: Mixdesk chats in text "
            "(images and sound are out of scope) and predicts one token at a time")


def _pickle_refusal() -> str:
    return ("is a pickle checkpoint, which can run arbitrary code when loaded; Mixdesk reads only "
            ".safetensors (convert it with a trusted tool, or download the safetensors version)")


def _quant_refusal(fmt: str) -> str:
    return (f"is a {fmt}-quantised checkpoint, which Mixdesk does not read; use the 16-bit "
            "safetensors checkpoint (Mixdesk quantises experts itself, per expert)")
