"""Export in the published Kimi K3 checkpoint layout (shared/spec/k3-checkpoint.md), and read it back.

  config.json                        top level model_type kimi_k3 with the decoder in text_config (its
                                     quantization_config included), written from the published config
                                     (tests/fixtures/k3_config.json) with this model's dimensions; no vision_config
                                     (the checkpoint has no vision tower)
  model-%05d-of-%06d.safetensors     shard n (1-based) holds layer n-1, the last shard the model-level tensors
  model.safetensors.index.json       metadata.total_size and the weight_map, sorted by name
  tiktoken.model, tokenizer_config.json   copied from the tokenizer directory

Tensor names carry "language_model."; dtypes as published: F32 for the KDA conv taps, A_log (zero-padded to a
multiple of 128), dt_bias, o_norm and the router's e_score_correction_bias; MXFP4 (U8 weight_packed +
weight_scale) for the routed experts; BF16 for everything else. Inside a shard tensors are ordered by dtype
(wider first) then name, as safetensors' own writer does.
"""
import json
import os
import shutil
import struct

import torch

import mxfp4

PREFIX = "language_model."
F32_SUFFIXES = ("conv1d.weight", ".A_log", ".dt_bias", ".o_norm.weight", ".e_score_correction_bias")
_DTYPE_RANK = {"F32": 3, "BF16": 2, "U8": 0}
_HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG_TEMPLATE = os.path.join(_HERE, "..", "..", "tests", "fixtures", "k3_config.json")


def _bytes(t, dtype):
    t = t.detach().cpu().contiguous()
    if dtype == "BF16":
        return t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    if dtype == "F32":
        return t.to(torch.float32).numpy().tobytes()
    if dtype == "U8":
        return t.to(torch.uint8).numpy().tobytes()
    raise ValueError(dtype)


def st_write(path, entries):
    """entries: [(name, dtype, shape, bytes)]; written in dtype-then-name order."""
    entries = sorted(entries, key=lambda e: (-_DTYPE_RANK[e[1]], e[0]))
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dt, shape, data in entries:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for e in entries:
            f.write(e[3])
    os.replace(tmp, path)
    return off


def st_read(path):
    """{name: tensor}: BF16 / F32 as float32, U8 as uint8, shapes as stored."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        b, e = h["data_offsets"]
        raw = bytearray(data[b:e])
        if h["dtype"] == "BF16":
            t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16).float() if raw else torch.zeros(0)
        elif h["dtype"] == "F32":
            t = torch.frombuffer(raw, dtype=torch.float32).clone()
        elif h["dtype"] == "U8":
            t = torch.frombuffer(raw, dtype=torch.uint8).clone()
        else:
            raise ValueError("%s: dtype %s" % (name, h["dtype"]))
        out[name] = t.reshape(h["shape"])
    return out


def checkpoint_tensors(model):
    """[(layer or -1, name, dtype, shape, tensor)] in the published naming; experts as MXFP4 pairs."""
    c = model.c
    out = []
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        t = t.detach().float().cpu()
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
        full = PREFIX + name
        if name.endswith(".A_log"):
            H = t.numel()
            padded = torch.zeros((H + 127) // 128 * 128)
            padded[:H] = t
            out.append((layer, full, "F32", list(padded.shape), padded))
        elif ".experts.w" in name:
            which = name.split(".")[-1]  # w1 / w2 / w3
            base = full[: -len(".experts." + which)]
            codes, e = mxfp4.quantize(t)
            packed, scale = mxfp4.pack(codes, e)
            for ex in range(c.num_experts):
                stem = "%s.experts.%d.%s" % (base, ex, which)
                out.append((layer, stem + ".weight_packed", "U8", list(packed[ex].shape), packed[ex]))
                out.append((layer, stem + ".weight_scale", "U8", list(scale[ex].shape), scale[ex]))
        elif name.endswith(F32_SUFFIXES):
            out.append((layer, full, "F32", list(t.shape), t))
        else:
            out.append((layer, full, "BF16", list(t.shape), t))
    return out


def config_json(c, template=CONFIG_TEMPLATE):
    with open(template) as f:
        cfg = json.load(f)
    cfg.pop("vision_config", None)
    t = cfg["text_config"]
    L = c.num_layers
    t.update({
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "num_hidden_layers": L,
        "rms_norm_eps": c.rms_norm_eps,
        "activation_situ_beta": c.situ_beta,
        "activation_situ_linear_beta": c.situ_linear_beta,
        "attn_res_block_size": c.attn_res_block_size,
        "first_k_dense_replace": c.first_k_dense_replace,
        "intermediate_size": c.intermediate_size,
        "num_experts": c.num_experts,
        "num_experts_per_token": c.num_experts_per_token,
        "num_shared_experts": c.num_shared_experts,
        "moe_intermediate_size": c.moe_intermediate_size,
        "routed_expert_hidden_size": c.routed_expert_hidden_size,
        "routed_scaling_factor": c.routed_scaling_factor,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_attention_heads,
        "q_lora_rank": c.q_lora_rank,
        "kv_lora_rank": c.kv_lora_rank,
        "qk_nope_head_dim": c.qk_nope_head_dim,
        "qk_rope_head_dim": c.qk_rope_head_dim,
        "v_head_dim": c.v_head_dim,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_id,
        "pad_token_id": c.pad_token_id,
    })
    la = t["linear_attn_config"]
    la.update({
        "full_attn_layers": sorted(c.full_attn_layers),
        "kda_layers": [l + 1 for l in range(L) if not c.is_mla(l)],
        "num_heads": c.kda_num_heads,
        "head_dim": c.kda_head_dim,
        "short_conv_kernel_size": c.kda_conv_kernel,
        "gate_lower_bound": c.kda_gate_lower_bound,
        "use_full_rank_gate": True,
    })
    cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"] = c.bos_token_id, c.eos_token_id, c.pad_token_id
    cfg["media_placeholder_token_id"] = c.bos_token_id + 21  # K3: 163584 + 21 = 163605
    return cfg


def export(model, out_dir, tokenizer_dir=None):
    """Writes the checkpoint into out_dir (created; existing checkpoint files replaced). Returns total bytes."""
    c = model.c
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        if f.endswith(".safetensors") or f == "model.safetensors.index.json":
            os.remove(os.path.join(out_dir, f))
    tensors = checkpoint_tensors(model)
    nshards = c.num_layers + 1
    files = ["model-%05d-of-%06d.safetensors" % (i + 1, nshards) for i in range(nshards)]
    weight_map, total = {}, 0
    for sh in range(nshards):
        layer = sh if sh < c.num_layers else -1
        entries = [(n, dt, shape, _bytes(t, dt)) for (l, n, dt, shape, t) in tensors if l == layer]
        total += st_write(os.path.join(out_dir, files[sh]), entries)
        for e in entries:
            weight_map[e[0]] = files[sh]
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config_json(c), f, indent=2, sort_keys=True)
        f.write("\n")
    if tokenizer_dir:
        for n in ("tiktoken.model", "tokenizer_config.json"):
            shutil.copy(os.path.join(tokenizer_dir, n), os.path.join(out_dir, n))
    return total


def read_checkpoint(d):
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        idx = json.load(f)
    out = {}
    for fn in sorted(set(idx["weight_map"].values())):
        out.update(st_read(os.path.join(d, fn)))
    missing = set(idx["weight_map"]) - set(out)
    if missing:
        raise ValueError("%s: index names %d tensors no shard holds, e.g. %s" % (d, len(missing), sorted(missing)[0]))
    return out


@torch.no_grad()
def load_exported(model, d):
    """Sets model's parameters to the values a checkpoint directory stores (BF16 rounding, MXFP4 experts
    dequantized, A_log unpadded): the model the engine runs, in float32."""
    c = model.c
    ck = read_checkpoint(d)
    used = set()
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        full = PREFIX + name
        if ".experts.w" in name:
            which = name.split(".")[-1]
            base = full[: -len(".experts." + which)]
            rows = []
            for ex in range(c.num_experts):
                stem = "%s.experts.%d.%s" % (base, ex, which)
                rows.append(mxfp4.unpack(ck[stem + ".weight_packed"], ck[stem + ".weight_scale"]))
                used |= {stem + ".weight_packed", stem + ".weight_scale"}
            p.copy_(torch.stack(rows))
        elif name.endswith(".A_log"):
            t = ck[full]
            if t[p.numel():].abs().max() if t.numel() > p.numel() else 0:
                raise ValueError("%s: padding entries are not zero" % full)
            p.copy_(t[: p.numel()])
            used.add(full)
        else:
            p.copy_(ck[full].reshape(p.shape))
            used.add(full)
    extra = set(ck) - used
    if extra:
        raise ValueError("%s: %d tensors the model does not have, e.g. %s" % (d, len(extra), sorted(extra)[0]))
    return model
