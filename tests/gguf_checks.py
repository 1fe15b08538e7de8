"""What the GGUF family tests (test_gguf_glm*, test_gguf_hybrid*, test_gguf_gemma4) share: a file
rewritten with other metadata or tensors, and llama-quantize's tensor types held against ours."""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as GT, GGUFReader, GGUFValueType, GGUFWriter

K_RECIPES = (("q4_k_m", 15), ("q5_k_m", 17))  # our recipe, llama.cpp's LLAMA_FTYPE_MOSTLY_*


def rewrite(src: Path, dst: Path, kv: dict | None = None, tensors=None) -> Path:
    """A copy of a GGUF file with metadata {arch}.key -> value set (None: removed; a float: FLOAT32; a
    list: an array) and its tensors passed through `tensors(list of (name, array, type)) -> list`
    (GGUFReader, then GGUFWriter)."""
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    kv = {f"{arch}.{k}": v for k, v in (kv or {}).items()}
    w = GGUFWriter(str(dst), arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in kv:
            continue
        if f.types[0] == GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), GGUFValueType.ARRAY, f.types[-1])
        else:
            w.add_key_value(k, f.contents(), f.types[0])
    for k, v in kv.items():
        if isinstance(v, str):
            w.add_key_value(k, v, GGUFValueType.STRING)
        elif isinstance(v, float):
            w.add_key_value(k, v, GGUFValueType.FLOAT32)
        elif isinstance(v, list):
            w.add_array(k, v)
        elif v is not None:
            w.add_key_value(k, v, GGUFValueType.UINT32)
    ts = [(t.name, np.array(t.data), t.tensor_type) for t in r.tensors]
    for name, data, qtype in (tensors(ts) if tensors else ts):
        w.add_tensor(name, data, raw_dtype=None if qtype in (GT.F32, GT.F16) else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def same_types_as_llama_quantize(llama_cpp, write_gguf, src: Path, tmp_path: Path) -> dict[str, dict]:
    """Our Q4_K_M and Q5_K_M files of `src` give every tensor the type llama-quantize (llama-cpp-python's
    llama_model_quantize, from our F16 file) gives it: asserted; returns {recipe: our {name: type}}."""
    f16 = write_gguf(src, tmp_path / "f16.gguf", "f16")[0]
    ours_all = {}
    for recipe, ftype in K_RECIPES:
        ours = write_gguf(src, tmp_path / f"{recipe}.gguf", recipe)[0]
        theirs = tmp_path / f"llama-{recipe}.gguf"
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.nthread = ftype, 2
        assert llama_cpp.llama_model_quantize(str(f16).encode(), str(theirs).encode(), ctypes.byref(params)) == 0
        a = {t.name: t.tensor_type for t in GGUFReader(theirs).tensors}
        b = {t.name: t.tensor_type for t in GGUFReader(ours).tensors}
        assert a == b, {k: (a[k].name, b.get(k)) for k in a if a[k] != b.get(k)}
        ours_all[recipe] = b
    return ours_all
