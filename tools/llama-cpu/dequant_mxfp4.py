#!/usr/bin/env python3
"""A K3 checkpoint with MXFP4 routed experts (compressed-tensors: experts.E.wN.weight_packed / weight_scale)
rewritten with bf16 experts (experts.E.wN.weight) of exactly the same values, for tools/llama-cpu-compare.sh.

    python3 tools/llama-cpu/dequant_mxfp4.py SRC_DIR DST_DIR

Every MXFP4 value (an E2M1 code times 2^(scale - 127)) is a bf16 number, so the rewrite is lossless. It lets
llama.cpp run the MXFP4 model's weights through its bf16 products: its MXFP4 products round the activations
to Q8_0 blocks first (ggml's vec_dot_type for MXFP4), which k3c does not do, so the bf16 form separates that
rounding from the engines' agreement. The decoding follows ../shared/spec/k3-checkpoint.md §2.6: even element in
the low nibble, codes [0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, ...], one E8M0 scale byte per 32 inputs of a row.
The other tensors are copied as they are; config.json loses its quantization_config.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

FP4 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)


def dequant(packed, scale):
    rows, half = packed.shape
    p = packed.to(torch.int64)
    codes = torch.stack((p & 15, p >> 4), dim=-1).reshape(rows, half * 2)
    w = FP4[codes].reshape(rows, -1, 32) * torch.exp2(scale.to(torch.float32) - 127).unsqueeze(-1)
    return w.reshape(rows, half * 2).to(torch.bfloat16)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(src, "model.safetensors.index.json")) as f:
        index = json.load(f)
    shards = sorted(set(index["weight_map"].values()))
    weight_map = {}
    for shard in shards:
        t = load_file(os.path.join(src, shard))
        out = {}
        for name, x in t.items():
            if name.endswith(".weight_scale"):
                continue
            if name.endswith(".weight_packed"):
                base = name[: -len("_packed")]
                out[base] = dequant(x, t[base + "_scale"])
            else:
                out[name] = x
        save_file(out, os.path.join(dst, shard), metadata={"format": "pt"})
        weight_map.update({n: shard for n in out})
    index["weight_map"] = dict(sorted(weight_map.items()))
    index.get("metadata", {}).pop("total_size", None)
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config.pop("quantization_config", None)
    config.get("text_config", {}).pop("quantization_config", None)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for name in os.listdir(src):
        if name not in ("config.json", "model.safetensors.index.json") and not name.endswith(".safetensors"):
            p = os.path.join(src, name)
            if os.path.isfile(p):
                with open(p, "rb") as a, open(os.path.join(dst, name), "wb") as b:
                    b.write(a.read())


if __name__ == "__main__":
    main()
