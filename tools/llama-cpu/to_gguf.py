#!/usr/bin/env python3
"""A k3c Kimi Linear or Kimi K3 checkpoint (k3c synth / tools/synth_config.c) as a GGUF, through llama.cpp's
own convert_hf_to_gguf.py (its KimiLinearModel, or its KimiK3Model for a K3 config), for
tools/llama-cpu-compare.sh.

    python3 tools/llama-cpu/to_gguf.py --llama-dir LLAMA_DIR --model DIR --out FILE.gguf

K3 (config.json's architectures KimiK3ForConditionalGeneration, the published spelling k3c writes): the
converter reads the folder as it is (language_model. prefix, text_config, w1/w2/w3 experts, MXFP4 experts
in compressed-tensors form, which it repacks into ggml's MXFP4 blocks losslessly); only the tokenizer below
is supplied (KimiK3Model.set_vocab calls KimiLinearModel's, which is the one replaced).

Kimi Linear: three things the converter expects that a k3c checkpoint does not have, worked around here and
nowhere else:
- the tokenizer: Moonshot's checkpoints load theirs through transformers' remote code (tokenization_kimi.py),
  which k3c does not write; k3c writes the same tiktoken form (tiktoken.model: base64 bytes and rank per
  line; tokenizer_config.json: the special tokens by id). KimiLinearModel.set_vocab is replaced by one that
  reads those two files and builds what the converter's own "kimi-k2" branch builds from the remote
  tokenizer: byte-level tokens, the merges recovered from the ranks, "kimi-k2" pre-tokenization.
- the config spelling: a transformers-spelled config (layer_types / mlp_layer_types / linear_*) is rewritten
  into the released one (linear_attn_config, first_k_dense_replace, moe_router_activation_func) in a
  staging folder beside the weights (symlinks), which is what the converter reads.
- the dense layers' MLP: k3c (like transformers' Kimi Linear) names it `block_sparse_moe.{gate,up,down}_proj`,
  which the converter's tensor map does not know; it is renamed `mlp.` on the way in.
The weights pass through unchanged (--outtype bf16; MXFP4 experts stay MXFP4): the same numbers k3c reads.
"""
import argparse
import base64
import json
import os
import sys
import tempfile


def released_config(c):
    """c in the released spelling (a copy; unchanged if it already is)."""
    c = dict(c)
    if "linear_attn_config" not in c:
        types = c.pop("layer_types")
        c["linear_attn_config"] = {
            "full_attn_layers": [i + 1 for i, t in enumerate(types) if t == "full_attention"],
            "kda_layers": [i + 1 for i, t in enumerate(types) if t == "linear_attention"],
            "head_dim": c.pop("linear_head_dim"),
            "num_heads": c.pop("linear_num_heads"),
            "short_conv_kernel_size": c.pop("linear_conv_kernel_dim"),
        }
    if "first_k_dense_replace" not in c:
        mlp = c.pop("mlp_layer_types")
        dense = 0
        while dense < len(mlp) and mlp[dense] == "dense":
            dense += 1
        if any(t == "dense" for t in mlp[dense:]):
            raise SystemExit("mlp_layer_types: dense layers after the first sparse one have no released spelling")
        c["first_k_dense_replace"] = dense
        c["moe_layer_freq"] = 1
    # transformers' spelling leaves the router's activation implicit (Kimi Linear's is a sigmoid); the
    # converter writes llama.cpp's expert_gating_func from this key, which llama.cpp requires
    c.setdefault("moe_router_activation_func", "sigmoid")
    return c


def stage(model, where):
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(where, "config.json"), "w") as f:
        json.dump(released_config(config), f, indent=2)
    for name in os.listdir(model):
        if name != "config.json" and not name.startswith("."):
            os.symlink(os.path.abspath(os.path.join(model, name)), os.path.join(where, name))


def tiktoken_set_vocab(self):
    """The converter's kimi-k2 vocabulary, from k3c's tiktoken.model + tokenizer_config.json."""
    from conversion.base import gguf
    from conversion.qwen import QwenModel

    ranks = {}
    with open(self.dir_model / "tiktoken.model") as f:
        for line in f:
            if line.strip():
                b64, rank = line.split()
                ranks[base64.b64decode(b64)] = int(rank)
    with open(self.dir_model / "tokenizer_config.json") as f:
        tc = json.load(f)
    special = {int(i): t["content"] for i, t in tc.get("added_tokens_decoder", {}).items()}
    vocab_size = self.hparams["vocab_size"]
    by_id = {r: QwenModel.token_bytes_to_string(b) for b, r in ranks.items()}
    merges = []
    for b, r in ranks.items():
        if len(b) > 1:
            parts = QwenModel.bpe(ranks, b, max_rank=r)
            if len(parts) == 2:
                merges.append(" ".join(map(QwenModel.token_bytes_to_string, parts)))
    tokens, types = [], []
    for i in range(vocab_size):
        if i in special:
            tokens.append(special[i])
            types.append(gguf.TokenType.CONTROL)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    w = self.gguf_writer
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("kimi-k2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                     ("pad_token_id", w.add_pad_token_id)):
        if self.hparams.get(key) is not None:
            add(self.hparams[key])
    w.add_add_bos_token(False)


def dense_mlp_renamed(modify):
    """modify_tensors with a dense layer's block_sparse_moe.{gate,up,down}_proj read as mlp."""
    def wrapped(self, data, name, bid):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            if name.endswith(f".block_sparse_moe.{proj}.weight"):
                name = name.replace(f".block_sparse_moe.{proj}.", f".mlp.{proj}.")
        return modify(self, data, name, bid)
    return wrapped


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-dir", required=True, help="llama.cpp source tree (convert_hf_to_gguf.py, gguf-py)")
    ap.add_argument("--model", required=True, help="k3c Kimi Linear or K3 checkpoint folder")
    ap.add_argument("--out", required=True, help="GGUF file to write")
    ap.add_argument("--outtype", default="bf16", choices=("bf16", "f32"),
                    help="the converter's --outtype: bf16 (the checkpoint's numbers) or f32 (the same numbers "
                         "widened, so that llama.cpp's products do not round the activations to bf16)")
    a = ap.parse_args()
    llama = os.path.abspath(a.llama_dir)
    if not os.path.isfile(os.path.join(llama, "convert_hf_to_gguf.py")):
        raise SystemExit(f"--llama-dir {llama}: no convert_hf_to_gguf.py there")
    sys.path[:0] = [llama, os.path.join(llama, "gguf-py")]
    import convert_hf_to_gguf
    from conversion.kimi_linear import KimiLinearModel

    KimiLinearModel.set_vocab = tiktoken_set_vocab
    with open(os.path.join(a.model, "config.json")) as f:
        arch = (json.load(f).get("architectures") or [""])[0]
    if arch == "KimiK3ForConditionalGeneration":
        # the published K3 layout as k3c writes it: nothing to stage
        sys.argv = ["convert_hf_to_gguf.py", a.model, "--outfile", a.out, "--outtype", a.outtype]
        convert_hf_to_gguf.main()
        return
    KimiLinearModel.modify_tensors = dense_mlp_renamed(KimiLinearModel.modify_tensors)
    with tempfile.TemporaryDirectory(prefix="k3c-gguf-") as where:
        stage(a.model, where)
        sys.argv = ["convert_hf_to_gguf.py", where, "--outfile", a.out, "--outtype", a.outtype]
        convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
