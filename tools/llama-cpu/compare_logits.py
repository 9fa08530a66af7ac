#!/usr/bin/env python3
"""The last prompt row's logits of k3c (k3c logits: float32 [len, vocab]) against a reference: llama.cpp's
(llama-debug --save-logits: float32 [vocab] of the last token) or another k3c file of the same prompt, for
tools/llama-cpu-compare.sh. Prints the cosine, the relative L2 difference ||a - b|| / ||b||, the largest
difference relative to the reference's range, both argmaxes and how many of the top 10 agree; exits 1 when
they disagree beyond bf16 noise (cosine below --min-cosine or another argmax).

    python3 tools/llama-cpu/compare_logits.py K3C_LOGITS REFERENCE --tokens N [--names k3c,llama.cpp]
"""
import argparse
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("k3c")
    ap.add_argument("ref")
    ap.add_argument("--tokens", type=int, required=True, help="prompt length of the k3c file")
    ap.add_argument("--min-cosine", type=float, default=0.999)
    ap.add_argument("--names", default="k3c,llama.cpp", help="the two files' names in the printed line")
    a = ap.parse_args()
    kk = np.fromfile(a.k3c, dtype=np.float32)
    ll = np.fromfile(a.ref, dtype=np.float32)
    if kk.size % a.tokens:
        sys.exit(f"{a.k3c}: {kk.size} floats are not {a.tokens} rows")
    vocab = kk.size // a.tokens
    if ll.size not in (vocab, a.tokens * vocab):
        sys.exit(f"{a.ref}: {ll.size} floats, expected {vocab} or {a.tokens} x {vocab}")
    k = kk[-vocab:].astype(np.float64)
    l = ll[-vocab:].astype(np.float64)
    kn, ln = a.names.split(",")
    if not (np.isfinite(k).all() and np.isfinite(l).all()):
        sys.exit("non-finite logits")
    cos = float(k @ l / (np.linalg.norm(k) * np.linalg.norm(l)))
    rel = float(np.abs(k - l).max() / (l.max() - l.min()))
    rel2 = float(np.linalg.norm(k - l) / np.linalg.norm(l))
    top_k, top_l = np.argsort(-k)[:10], np.argsort(-l)[:10]
    same = len(set(top_k) & set(top_l))
    print(f"last-row logits over {vocab} ids, {kn} against {ln}: cosine {cos:.6f} (1 - cosine {1 - cos:.1e}), rel L2 {rel2:.1e}, max difference {rel:.4f} of the "
          f"range; argmax {top_k[0]} / {top_l[0]}; top-10 overlap {same}/10")
    return 0 if cos >= a.min_cosine and top_k[0] == top_l[0] else 1


if __name__ == "__main__":
    sys.exit(main())
