#!/usr/bin/env python3
"""Extracts the training text from the installed fortune packages into --data DIR and trains the tokenizer.

  DIR/train.txt, DIR/valid.txt, DIR/heldout.txt   documents joined fortune-style (a "%" line after each)
  DIR/sources.json                                 packages, versions, documents and bytes per split
  DIR/tokenizer/{tiktoken.model,tokenizer_config.json,verify.json}

The split is by a hash of each document (fortunes.split_of), the tokenizer is trained on train.txt only.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat  # noqa: E402
import fortunes  # noqa: E402
import tokenizer  # noqa: E402

VALID_PERMILLE = 16
HELDOUT_PERMILLE = 16
NUM_BASE = 3840  # + 256 specials = vocab 4096


def dpkg_version(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def chat_markup(repeat=200):
    """The text segments of the chat format (tags, attributes, the prompts the training chats use), so that the
    tokenizer gives the markup a few tokens of its own: `repeat` copies of each."""
    texts = ["message", "think", "response"] + [' role="%s"' % r for r in ("system", "user", "assistant")]
    texts += chat.PROMPTS_EN + chat.PROMPTS_ZH + chat.AGAIN_EN + chat.AGAIN_ZH + [chat.SYSTEM_EN, chat.SYSTEM_ZH]
    return texts * repeat


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--fortune-dir", default=fortunes.FORTUNE_DIR)
    ap.add_argument("--num-base", type=int, default=NUM_BASE)
    args = ap.parse_args()
    docs = fortunes.collect(args.fortune_dir)
    if not docs:
        sys.exit("no fortune files under %s: apt-get install fortunes fortunes-min fortunes-zh" % args.fortune_dir)
    splits = {"train": [], "valid": [], "heldout": []}
    stats = {}
    for pkg, name, d in docs:
        s = fortunes.split_of(d, VALID_PERMILLE, HELDOUT_PERMILLE)
        splits[s].append(d)
        if pkg not in stats:
            stats[pkg] = {"version": dpkg_version(pkg), "files": set(), "documents": 0, "bytes": 0}
        st = stats[pkg]
        st["files"].add(name)
        st["documents"] += 1
        st["bytes"] += len(d.encode("utf-8"))
    os.makedirs(args.data, exist_ok=True)
    info = {"packages": {}, "splits": {}, "format": "documents joined by %r" % fortunes.SEPARATOR}
    for pkg, st in stats.items():
        info["packages"][pkg] = dict(st, files=sorted(st["files"]))
    for s, ds in splits.items():
        text = fortunes.join(ds)
        with open(os.path.join(args.data, s + ".txt"), "w", encoding="utf-8") as f:
            f.write(text)
        info["splits"][s] = {"documents": len(ds), "bytes": len(text.encode("utf-8"))}
    tdir = os.path.join(args.data, "tokenizer")
    pieces = [d + fortunes.SEPARATOR for d in splits["train"]]
    ranks, hf = tokenizer.train(pieces + chat_markup(), args.num_base)
    tokenizer.write(tdir, ranks)
    equal, total, first_bad = tokenizer.verify(tdir, hf, pieces)
    tok = tokenizer.Tok(tdir)
    held = open(os.path.join(args.data, "heldout.txt"), encoding="utf-8").read()
    whole = tok.encode(held)
    per_doc = [i for d in splits["heldout"] for i in tok.encode(d + fortunes.SEPARATOR)]
    ver = {"tiktoken_equals_trainer": [equal, total], "first_mismatch": first_bad,
           "heldout_whole_equals_per_document": whole == per_doc, "heldout_tokens": len(whole),
           "train_tokens": sum(map(len, tok.encode_batch(pieces)))}
    with open(os.path.join(tdir, "verify.json"), "w") as f:
        json.dump(ver, f, indent=2)
    info["tokenizer"] = ver
    with open(os.path.join(args.data, "sources.json"), "w") as f:
        json.dump(info, f, indent=2, ensure_ascii=False)
    print(json.dumps(info, indent=2, ensure_ascii=False))
    if equal != total or not ver["heldout_whole_equals_per_document"]:
        sys.exit("tokenizer verification failed")


if __name__ == "__main__":
    main()
