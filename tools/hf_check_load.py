#!/usr/bin/env python3
"""Loads a checkpoint k3c wrote (k3c synth --preset kimi-linear-tiny) with transformers'
KimiLinearForCausalLM.from_pretrained and reports missing / unexpected / mismatched keys; exits non-zero
if any. Optionally compares transformers' fp32 logits with `k3c logits` output for the same ids.

    python3 tools/hf_check_load.py DIR [--k3c-logits FILE --ids 1,2,3 --prefill N]
"""
import argparse
import sys

import numpy as np
import torch
import transformers
from transformers import KimiLinearForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--k3c-logits")
    ap.add_argument("--ids")
    args = ap.parse_args()
    model, info = KimiLinearForCausalLM.from_pretrained(args.dir, torch_dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    print(f"transformers {transformers.__version__}: loaded {args.dir}: "
          + ", ".join(f"{k}={len(v)}" for k, v in info.items()))
    for k, v in bad.items():
        print(f"  {k}: {list(v)[:20]}")
    rc = 1 if bad else 0
    if args.k3c_logits and args.ids:
        ids = torch.tensor([[int(t) for t in args.ids.split(",")]])
        with torch.no_grad():
            ref = model(ids, use_cache=False).logits[0].numpy().astype(np.float64)
        ours = np.fromfile(args.k3c_logits, dtype=np.float32).reshape(ref.shape).astype(np.float64)
        rel = np.linalg.norm(ours - ref, axis=1) / np.linalg.norm(ref, axis=1)
        agree = (ours.argmax(1) == ref.argmax(1)).mean()
        print(f"k3c vs transformers logits: max row rel L2 {rel.max():.3e}, mean {rel.mean():.3e}, argmax agreement {agree:.3f}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
