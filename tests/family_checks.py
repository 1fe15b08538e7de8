"""Shared by several test modules (moved out of tests/test_families.py, which uses them too): eval_matches_transformers, greedy_matches_transformers, logit_error, run."""
import math
import os
import re
import subprocess
import sys
import torch
from engine.files.checkpoint import Checkpoint
from engine.model.forward import MoEModel
from engine.placement import Placement, Tier


CPU = torch.device("cpu")


def reference(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def run(model, ids, prefill=16):
    """Logits of a prefill of `prefill` tokens, then of one decode step per remaining token."""
    cache = model.new_cache(64)
    got = [model.forward(ids[:prefill], cache, 0, all_logits=True)]
    got += [model.forward(ids[i:i + 1], cache, i) for i in range(prefill, len(ids))]
    return torch.cat(got)


def logit_error(ck, where: str) -> float:
    """Largest fp32 logit difference from transformers over a 16-token prefill and 12 decode steps."""
    d = ck.dims
    pl = (Placement.uniform(d.layers, d.experts, Tier.CPU16) if where == "all-cpu"
          else Placement.random(d.layers, d.experts, [Tier.GPU16, Tier.CPU16], seed=5))
    ids = torch.randint(0, d.vocab, (28,), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        want = reference(ck.folder)(ids[None]).logits[0]
    return (run(MoEModel(ck, pl, CPU, torch.float32), ids) - want).abs().max().item()


def greedy_matches_transformers(folder) -> None:
    """16 greedy tokens on a mixed placement equal transformers' generate."""
    ck = Checkpoint(folder)
    prompt = torch.tensor([5, 17, 42, 8, 99, 3])
    with torch.no_grad():
        want = reference(folder).generate(prompt[None], max_new_tokens=16, do_sample=False, min_new_tokens=16,
                                          eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    d = ck.dims
    model = MoEModel(ck, Placement.random(d.layers, d.experts, [Tier.GPU16, Tier.CPU16], seed=2), CPU,
                         torch.float32)
    assert greedy(model, prompt, 16) == want


def greedy(model, prompt: torch.Tensor, n: int) -> list[int]:
    """n greedy tokens after prompt, one decode step at a time."""
    cache = model.new_cache(64)
    logits = model.forward(prompt, cache, 0)
    got, pos = [], len(prompt)
    for _ in range(n):
        got.append(int(logits[-1].argmax()))
        logits = model.forward(torch.tensor(got[-1:]), cache, pos)
        pos += 1
    return got


def eval_matches_transformers(folder, tmp_path):
    """`mixdesk eval --dtype fp32 --placement cpu` gives transformers' perplexity on the same tokens."""
    env = dict(os.environ)  # the caller's cache (window_cache: this machine measured once per run)
    r = subprocess.run([sys.executable, "-m", "engine.tools.cli", "eval", "--model", str(folder), "--dtype", "fp32",
                        "--placement", "cpu", "--tokens", "96", "--new-tokens", "4"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    ppl = float(re.search(r"perplexity ([0-9.]+), 96 tokens", r.stdout)[1])
    from transformers import AutoTokenizer

    from engine.model.evaluate import corpus_ids

    ids = torch.tensor(corpus_ids(AutoTokenizer.from_pretrained(str(folder)), None, 96))
    with torch.no_grad():
        logits = reference(folder)(ids[None]).logits[0, :-1]
    want = math.exp(float(torch.nn.functional.cross_entropy(logits, ids[1:])))
    assert abs(ppl - want) / want < 1e-5, (ppl, want)

