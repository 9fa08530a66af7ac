#!/usr/bin/env python3
"""Builds a small random KimiLinearForCausalLM with transformers, saves it with save_pretrained in bf16,
and records fp32 logits for a fixed prompt: a full pass and a prefill + cached-decode pass. The saved
checkpoint and logits are the external oracle for k3c's Kimi Linear path (tests/fixtures/kimi_linear_hf).

Runs where torch and transformers (5.x) are installed (an H200 host has both); never in CI.

    python3 tools/hf_kimi_linear_fixture.py --out tests/fixtures/kimi_linear_hf
"""
import argparse
import json
import os
import struct
import sys

import torch
import transformers
from transformers import KimiLinearConfig, KimiLinearForCausalLM


def write_f32(path, tensor):
    t = tensor.detach().to(torch.float32).contiguous().cpu()
    with open(path, "wb") as f:
        f.write(t.numpy().tobytes())


def min_router_margin(model, ids, k):
    """Smallest gap between the k-th and (k+1)-th selection score (score + correction bias) over every token
    and MoE layer, computed in fp32 on the bf16 weights."""
    ref = model.to(torch.float32)
    margins = []

    def hook(module, inputs, output):
        x = inputs[0].reshape(-1, module.hidden_dim).float()
        s = torch.sigmoid(x @ module.weight.float().t()) + module.e_score_correction_bias.float()
        top = torch.topk(s, k + 1, dim=-1).values
        margins.append(float((top[:, k - 1] - top[:, k]).min()))

    handles = [m.register_forward_hook(hook) for m in ref.modules() if type(m).__name__ == "KimiLinearTopkRouter"]
    with torch.no_grad():
        ref(ids, use_cache=False)
    for h in handles:
        h.remove()
    model.to(torch.bfloat16)
    return min(margins)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--prefill", type=int, default=7)
    ap.add_argument("--min-margin", type=float, default=0.01)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    layer_types = ["linear_attention", "linear_attention", "full_attention", "linear_attention", "full_attention"]
    cfg = KimiLinearConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
        num_hidden_layers=len(layer_types), num_attention_heads=4, num_key_value_heads=4,
        n_shared_experts=1, routed_scaling_factor=2.446, kv_lora_rank=64, q_lora_rank=None,
        qk_rope_head_dim=32, v_head_dim=32, qk_nope_head_dim=32, num_local_experts=8, num_experts_per_tok=2,
        n_group=1, topk_group=1, norm_topk_prob=True, hidden_act="silu", rms_norm_eps=1e-5,
        linear_head_dim=32, linear_num_heads=4, linear_conv_kernel_dim=4, layer_types=layer_types,
        mlp_layer_types=["dense"] + ["sparse"] * (len(layer_types) - 1), initializer_range=0.08,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    # Routing is the one discontinuous function in the model: a near-tie between the k-th and (k+1)-th
    # expert flips under bf16 activation rounding and changes every later row. Retry seeds until the
    # smallest selection margin over the prompt is comfortably above bf16 noise, so the fixture checks
    # k3c's default (bf16) path too, not only its f32 diagnostic mode.
    ids = None
    for attempt in range(400):
        torch.manual_seed(args.seed + attempt)
        model = KimiLinearForCausalLM(cfg).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.ndim == 1 or "A_log" in name or "dt_bias" in name:
                    p.add_(0.1 * torch.randn_like(p))
                if name.endswith("mlp.gate.weight"):
                    p.mul_(2.0)  # wider score spread: larger gaps between selected and unselected experts
            for name, b in model.named_buffers():
                if "e_score_correction_bias" in name:
                    b.copy_(0.02 * torch.randn_like(b))
        model = model.to(torch.bfloat16)
        g = torch.Generator().manual_seed(args.seed + 1)
        ids = torch.randint(0, cfg.vocab_size, (1, 12), generator=g)
        margin = min_router_margin(model, ids, cfg.num_experts_per_tok)
        print(f"seed {args.seed + attempt}: smallest router selection margin {margin:.4f}")
        if margin > args.min_margin:
            break
    else:
        raise SystemExit("no seed gave router margins above --min-margin")
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)

    # The oracle: the saved bf16 weights, upcast, run in fp32.
    ref = KimiLinearForCausalLM.from_pretrained(args.out, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        full = ref(ids, use_cache=False).logits[0]
        out = ref(ids[:, : args.prefill], use_cache=True)
        rows = [out.logits[0]]
        past = out.past_key_values
        for t in range(args.prefill, ids.shape[1]):
            out = ref(ids[:, t : t + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            rows.append(out.logits[0])
        cached = torch.cat(rows, 0)
    write_f32(os.path.join(args.out, "logits_full.f32"), full)
    write_f32(os.path.join(args.out, "logits_cached.f32"), cached)
    meta = {
        "transformers": transformers.__version__, "torch": torch.__version__,
        "prompt_ids": ids[0].tolist(), "prefill": args.prefill, "vocab": cfg.vocab_size,
        "full_vs_cached_max_abs": float((full - cached).abs().max()),
        "min_router_margin": margin,
    }
    with open(os.path.join(args.out, "oracle.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta))
    for name, p in ref.state_dict().items():
        print("param", name, tuple(p.shape))


if __name__ == "__main__":
    sys.exit(main())
