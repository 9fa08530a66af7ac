#!/usr/bin/env python3
"""Held-out perplexity of an exported checkpoint computed by k3c's engine (`k3c logits`, one prefill per
window), by train.py's protocol, next to the trainer's own number from metrics.json.

  python3 tools/train_k3/eval_k3c.py --model OUT/model [--metrics OUT/metrics.json] [--text F] [--f32]

Until k3c has its own perplexity command this is how the engine's perplexity is measured; the text is encoded
with Python tiktoken over the checkpoint's tokenizer files (the engine's ids then come from the same ranks).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tokenizer  # noqa: E402
from train import eval_windows  # noqa: E402

ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--metrics", help="train.py's metrics.json (default: beside the model directory)")
    ap.add_argument("--text", default=os.path.join(HERE, "data", "heldout.txt"))
    ap.add_argument("--window", type=int, default=0, help="default: the metrics' window, else 512")
    ap.add_argument("--k3c", default=os.path.join(ROOT, "build", "k3c"))
    ap.add_argument("--f32", action="store_true", help="k3c with float32 activations")
    ap.add_argument("--tokens", type=int, default=0,
                    help="only the first N tokens (compared with the trainer when it ran with --eval-tokens N)")
    args = ap.parse_args()
    mpath = args.metrics or os.path.join(os.path.dirname(os.path.abspath(args.model)), "metrics.json")
    metrics = json.load(open(mpath)) if os.path.exists(mpath) else None
    window = args.window or (metrics["perplexity_protocol"]["window"] if metrics else 512)
    tok = tokenizer.Tok(args.model)
    ids = tok.encode(open(args.text, encoding="utf-8").read())
    if args.tokens:
        ids = ids[: args.tokens]
    wins = eval_windows(ids, window)
    tmp = tempfile.mkdtemp(prefix="k3-ppl-")
    nll, cnt = 0.0, 0
    for i, w in enumerate(wins):
        out = os.path.join(tmp, "w.f32")
        cmd = [args.k3c, "logits", "--model", args.model, "--prompt-ids", ",".join(map(str, w)), "--prefill",
               str(len(w)), "--out", out] + (["--f32"] if args.f32 else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("k3c logits failed on window %d: %s" % (i, r.stderr.strip()))
        lg = torch.frombuffer(bytearray(open(out, "rb").read()), dtype=torch.float32).view(len(w), -1)
        t = torch.tensor(w)
        nll += F.cross_entropy(lg[:-1], t[1:], reduction="sum").item()
        cnt += len(w) - 1
    p = math.exp(nll / cnt)
    print("k3c %s: %d windows of %d, %d predicted tokens, NLL %.3f, perplexity %.4f" %
          ("f32" if args.f32 else "bf16", len(wins), window, cnt, nll, p))
    if metrics and (metrics["args"].get("eval_tokens") or 0) == args.tokens:
        ref = metrics["perplexity"]["exported"]["heldout"]
        print("trainer (exported weights, float32): perplexity %.4f; k3c / trainer - 1 = %+.3f%%" %
              (ref, 100 * (p / ref - 1)))


if __name__ == "__main__":
    main()
