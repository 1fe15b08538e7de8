"""`mixdesk` command line: chat, bench, tiny-model. Errors print one line, never a traceback."""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from .errors import MixdeskError


def _progress(quiet: bool):
    def show(done: int, total: int, what: str) -> None:
        if quiet:
            return
        width = 30
        fill = int(width * done / total)
        sys.stderr.write(f"\rloading [{'#' * fill}{'.' * (width - fill)}] {done}/{total} {what[:28]:<28}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return show


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="a Mixtral-compatible model folder (safetensors), or a Hugging Face repo id "
                   "(owner/name, downloaded into the HF cache); default: the built-in demo")
    p.add_argument("--placement", default="auto",
                   help="auto | gpu | cpu | random:SEED | a JSON placement file (default: auto)")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: CUDA when available)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"],
                   help="16-bit compute format; auto = bf16 on GPUs, the faster of bf16/fp16 measured on CPUs")
    p.add_argument("--ctx", type=int, default=4096, help="context length in tokens")


def _params(a):
    from .generate import SamplingParams

    return SamplingParams(max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_p=a.top_p,
                          top_k=a.top_k, repetition_penalty=a.repetition_penalty, seed=a.seed,
                          stop=tuple(a.stop or ()))


def _model_path(a) -> str:
    if a.model:
        from .hub import resolve

        return str(resolve(a.model))
    from . import demo

    log = (lambda s: None) if getattr(a, "quiet", False) else (lambda s: print(s, file=sys.stderr))
    return str(demo.ensure(progress=_progress(getattr(a, "quiet", False)), log=log))


def cmd_chat(a) -> int:
    from .load import load

    a.model = _model_path(a)
    loaded = load(a.model, a.placement, a.device, a.dtype, a.ctx, progress=_progress(a.quiet))
    if not a.quiet:
        print(loaded.describe(), file=sys.stderr)
    messages: list[dict] = []
    if a.system:
        messages.append({"role": "system", "content": a.system})
    prompts = [a.prompt] if a.prompt is not None else None
    while True:
        if prompts is not None:
            if not prompts:
                return 0
            user = prompts.pop(0)
        else:
            try:
                user = input("\nyou> ")
            except EOFError:
                return 0
            if user.strip() in ("/quit", "/exit"):
                return 0
            if not user.strip():
                continue
        messages.append({"role": "user", "content": user})
        ids = loaded.generator.chat_prompt(messages)
        cancel = threading.Event()
        if prompts is None:
            print("mixdesk> ", end="", flush=True)
        fin = None
        try:
            for ev in loaded.generator.stream(ids, _params(a), cancel):
                if hasattr(ev, "reason"):
                    fin = ev
                else:
                    print(ev.text, end="", flush=True)
        except KeyboardInterrupt:  # Ctrl-C stops this reply, not the program
            cancel.set()
            print(" [stopped]")
            messages.pop()
            continue
        print()
        messages.append({"role": "assistant", "content": fin.text})
        if not a.quiet:
            print(f"[{fin.reason}; prefill {fin.prompt_tokens - fin.reused_tokens} tok in {fin.prefill_s:.2f}s, "
                  f"decode {fin.decode_tok_s:.1f} tok/s]", file=sys.stderr)


def cmd_bench(a) -> int:
    if a.what == "kernels":
        from . import bench_kernels

        bench_kernels.run()
        return 0
    import psutil
    import torch

    from .generate import SamplingParams
    from .load import load
    from .memory import PeakRSS

    a.model = _model_path(a)
    with PeakRSS() as peak:
        t0 = time.perf_counter()
        loaded = load(a.model, a.placement, a.device, a.dtype, a.ctx, progress=_progress(True))
        load_s = time.perf_counter() - t0
        print(loaded.describe())
        gen = loaded.generator
        vocab = loaded.ckpt.dims.vocab
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(10, vocab, (a.prompt_tokens,), generator=g).tolist()
        results = []
        for rep in range(a.repeats):
            gen.cache.tokens = []  # measure a cold prefill every time
            fin = None
            for ev in gen.stream(prompt, SamplingParams(max_new_tokens=a.new_tokens)):
                fin = ev
            results.append(fin)
    best = max(results, key=lambda f: f.decode_tok_s)
    print(f"load            {load_s:8.2f} s")
    print(f"prefill         {a.prompt_tokens / best.prefill_s:8.1f} tok/s ({a.prompt_tokens} tokens)")
    print(f"decode          {best.decode_tok_s:8.2f} tok/s ({len(best.token_ids)} tokens, best of {a.repeats})")
    print(f"peak RSS        {peak.peak / 2**20:8.0f} MiB (now {psutil.Process().memory_info().rss / 2**20:.0f} MiB)")
    if loaded.accel.is_cuda:
        print(f"peak VRAM       {torch.cuda.max_memory_allocated(loaded.accel.device) / 2**20:8.0f} MiB")
    else:
        print("peak VRAM       n/a (CPU-only)")
    return 0


def cmd_tiny_model(a) -> int:
    from .tiny_model import write_tiny_mixtral

    out = write_tiny_mixtral(a.out, shard_size=a.shard_size)
    print(f"wrote a tiny random Mixtral to {out}")
    return 0


def cmd_synthetic_model(a) -> int:
    from .synthetic import write_synthetic

    config = a.config or str(Path(__file__).resolve().parents[1] / "resources" / "mixtral-8x7b-config.json")
    out = write_synthetic(a.out, config, seed=a.seed)
    print(f"wrote a synthetic model (weights generated on demand, nothing stored) to {out}")
    return 0


def cmd_demo_model(a) -> int:
    from . import demo

    out = demo.ensure(a.out, progress=_progress(False), log=lambda s: print(s, file=sys.stderr))
    print(out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mixdesk", description="Chat with Mixture-of-Experts models "
                                 "that do not fit in your GPU, with per-expert CPU/GPU placement.")
    sub = ap.add_subparsers(dest="cmd")
    c = sub.add_parser("chat", help="interactive terminal chat with streaming")
    _add_model_args(c)
    c.add_argument("--prompt", help="send one message, print the reply and exit (non-interactive)")
    c.add_argument("--system", help="system prompt")
    c.add_argument("--max-new-tokens", type=int, default=512)
    c.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    c.add_argument("--top-p", type=float, default=1.0)
    c.add_argument("--top-k", type=int, default=0)
    c.add_argument("--repetition-penalty", type=float, default=1.0)
    c.add_argument("--seed", type=int, default=None)
    c.add_argument("--stop", action="append", help="stop string (repeatable)")
    c.add_argument("--quiet", action="store_true", help="print only the reply")
    c.set_defaults(fn=cmd_chat)
    b = sub.add_parser("bench", help="model: prefill and decode tok/s, peak RSS and VRAM; "
                       "kernels: one Mixtral-size expert in every tier, vs read bandwidth")
    b.add_argument("what", nargs="?", choices=["model", "kernels"], default="model")
    _add_model_args(b)
    b.add_argument("--prompt-tokens", type=int, default=64)
    b.add_argument("--new-tokens", type=int, default=128)
    b.add_argument("--repeats", type=int, default=2)
    b.set_defaults(fn=cmd_bench)
    m = sub.add_parser("demo-model", help="build the demo model (SmolLM2-135M upcycled to 8 experts)")
    m.add_argument("--out", default=None, help="folder to build into (default: the user data folder)")
    m.set_defaults(fn=cmd_demo_model)
    from .cli_plan import add_parsers

    add_parsers(sub, _add_model_args)
    t = sub.add_parser("tiny-model", help="write a tiny random Mixtral (for tests and self-checks)")
    t.add_argument("--out", required=True)
    t.add_argument("--shard-size", default=None)
    t.set_defaults(fn=cmd_tiny_model)
    y = sub.add_parser("synthetic-model", help="a model folder whose weights are seeded random tensors made on "
                       "demand (speed and memory at real size, e.g. Mixtral-8x7B, with nothing downloaded)")
    y.add_argument("--out", required=True)
    y.add_argument("--config", default=None, help="a Mixtral config.json (default: Mixtral-8x7B's)")
    y.add_argument("--seed", type=int, default=0)
    y.set_defaults(fn=cmd_synthetic_model)
    return ap


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ap = build_parser()
    a = ap.parse_args(argv)
    if not getattr(a, "fn", None):  # no command: the terminal chat (the app's entry starts the window)
        a = ap.parse_args(["chat"])
    try:
        return a.fn(a) or 0
    except MixdeskError as e:
        print(f"mixdesk: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
