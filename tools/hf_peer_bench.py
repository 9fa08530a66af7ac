#!/usr/bin/env python3
"""The transformers peer of k3c's decode benchmark: KimiLinearForCausalLM (transformers 5.x) with random bf16
weights at a k3c preset's config, on one GPU, decoding through its own `generate` (greedy, cache on). Per
batch size: a prompt of --context random tokens per request; generate(max_new_tokens = 1) and generate(1 +
--steps) are timed and their difference over --steps is the decode step (prefill and the first token cancel).
A second figure times the model's forward directly, one cached decode step at a time (median). One PEER
line per batch and method. The KDA kernels transformers uses are reported: its
torch fallback, or flash-linear-attention's Triton kernels when `fla` is importable (install the wheels
fetched with `pip download flash-linear-attention fla-core einops --no-deps`).

Runs where torch with CUDA and transformers are installed (an H200 host); never in CI.

    build/k3c synth --preset kimi-linear-48b --out /tmp/kl48     # config.json only (a benchmark preset)
    python3 tools/hf_peer_bench.py --config /tmp/kl48 --batches 1,8 --context 512
"""
import argparse
import importlib.util
import statistics
import time

import torch
import transformers
from transformers import KimiLinearConfig, KimiLinearForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="directory with the config.json k3c synth wrote")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]

    cfg = KimiLinearConfig.from_pretrained(args.config)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        try:
            model = KimiLinearForCausalLM._from_config(cfg, dtype=torch.bfloat16)
        except TypeError:  # transformers before 5.0 spelled it torch_dtype
            model = KimiLinearForCausalLM._from_config(cfg, torch_dtype=torch.bfloat16)
    model.eval()
    torch.cuda.synchronize()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kda = "fla" if importlib.util.find_spec("fla") is not None else "torch-fallback"
    print(f"peer: transformers {transformers.__version__}, torch {torch.__version__}, KDA kernels: {kda}, "
          f"{weight_bytes / 1e9:.2f} GB of bf16 weights, built in {time.perf_counter() - t0:.1f} s", flush=True)

    for b in batches:
        ids = torch.randint(3, cfg.vocab_size, (b, args.context), device="cuda")
        mask = torch.ones_like(ids)

        def gen(n):
            torch.cuda.synchronize()
            t = time.perf_counter()
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           pad_token_id=0)
            torch.cuda.synchronize()
            return time.perf_counter() - t

        with torch.no_grad():
            gen(2)  # warm-up
            t1 = min(gen(1) for _ in range(2))
            tn = min(gen(1 + args.steps) for _ in range(2))
        step = (tn - t1) / args.steps
        print(f"PEER transformers-generate kda={kda} batch {b} context {args.context} prefill+1_s {t1:.2f} "
              f"step_ms {step * 1e3:.2f} tokens_per_s {b / step:.1f}", flush=True)

        times = []
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True)
            pkv = out.past_key_values
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            for i in range(args.warmup + args.steps):
                torch.cuda.synchronize()
                t = time.perf_counter()
                out = model(input_ids=nxt, past_key_values=pkv, use_cache=True)
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                torch.cuda.synchronize()
                dt = time.perf_counter() - t
                pkv = out.past_key_values
                if i >= args.warmup:
                    times.append(dt)
        med = statistics.median(times)
        print(f"PEER transformers-forward kda={kda} batch {b} context {args.context} step_ms {med * 1e3:.2f} "
              f"tokens_per_s {b / med:.1f}", flush=True)
        del pkv, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
