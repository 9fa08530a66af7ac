#!/usr/bin/env python3
"""Builds the tokenizer test data of k3c: rank files in the tiktoken.model format, their
tokenizer_config.json files, and the golden ids Python tiktoken 0.14 gives for them (Kimi's encode:
kimi_ref.py) over the corpus of cases.py. tests/test_tokenizer.c compares the C tokenizer with every case.

    python3 tools/tokenizer/make_goldens.py           goldens from the committed rank files
    python3 tools/tokenizer/make_goldens.py --train   first retrain the rank files (train_bpe.py; ~1 min)

Rank files (the real 163,584-rank file is not available here; these exercise the same code):
  bytes-gpt2        the 256 single bytes in GPT-2 bytes_to_unicode order, no merges       (K3 specials)
  train-512-rawbytes  bytes in byte order (rank = byte value), then 256 trained merges     (K2 specials)
  train-4096        GPT-2 byte order, then 3840 trained merges                             (K3 specials)
  shuffled-2048     the first 2048 tokens of train-4096 under a random rank permutation:
                    bytes anywhere, merge priorities unrelated to training order            (K2 specials)
  default-32512     GPT-2 byte order, then 32 256 trained merges: the tokenizer embedded in
                    k3c for synthesized presets (src/text/data/)                          (K3 specials)
Goldens are only valid for the rank files they were made from: rerun this script after --train."""
import argparse
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cases  # noqa: E402
import kimi_ref  # noqa: E402

ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
FIX = os.path.join("tests", "fixtures", "tokenizer")
DEFAULT = os.path.join("src", "text", "data", "default-32512.tiktoken")
CASES = os.path.join(FIX, "cases.txt")

FILES = [  # name, path, layout
    ("bytes-gpt2", os.path.join(FIX, "bytes-gpt2.tiktoken"), "k3"),
    ("train-512-rawbytes", os.path.join(FIX, "train-512-rawbytes.tiktoken"), "k2"),
    ("train-4096", os.path.join(FIX, "train-4096.tiktoken"), "k3"),
    ("shuffled-2048", os.path.join(FIX, "shuffled-2048.tiktoken"), "k2"),
    ("default-32512", DEFAULT, "k3"),
]


def train_all():
    import train_bpe
    t0 = time.time()
    texts = train_bpe.corpus_texts()
    words = train_bpe.count_words(texts)
    print(f"corpus: {len(texts)} texts, {sum(len(t) for _, t in texts)} characters, {len(words)} distinct pieces")
    gpt2 = train_bpe.gpt2_byte_order()
    big = train_bpe.train(words, gpt2, 32512)
    raw = train_bpe.train(words, list(range(256)), 512)
    out = {
        "bytes-gpt2": big[:256],
        "train-512-rawbytes": raw,
        "train-4096": big[:4096],
        "default-32512": big,
    }
    perm = list(range(2048))
    random.Random(2048).shuffle(perm)
    shuffled = [None] * 2048
    for old, new in enumerate(perm):
        shuffled[new] = big[old]
    out["shuffled-2048"] = shuffled
    for name, path, _ in FILES:
        os.makedirs(os.path.join(ROOT, os.path.dirname(path)), exist_ok=True)
        kimi_ref.write_ranks(os.path.join(ROOT, path), out[name])
        print(f"wrote {path} ({len(out[name])} ranks)")
    print(f"trained in {time.time() - t0:.1f} s")


def rle(seq, fmt):
    """Runs of a repeated unit (1..16 elements, at least 3 times) as `u,v*N`, other elements one by one."""
    out, i, n = [], 0, len(seq)
    while i < n:
        best = None
        for p in range(1, 17):
            if i + 2 * p > n:
                break
            unit = seq[i:i + p]
            k = 1
            while i + (k + 1) * p <= n and seq[i + k * p:i + (k + 1) * p] == unit:
                k += 1
            if k >= 3 and (best is None or k * p > best[0] * best[1]):
                best = (k, p)
        if best:
            k, p = best
            out.append(",".join(fmt(x) for x in seq[i:i + p]) + f"*{k}")
            i += k * p
        else:
            out.append(fmt(seq[i]))
            i += 1
    return " ".join(out)


def bytes_field(b):
    """Input bytes: runs of a repeated unit as `HEX*N`, the rest as hex words of up to 32 bytes."""
    out, i, n, lit = [], 0, len(b), bytearray()
    while i < n:
        best = None
        for p in range(1, 17):
            if i + 3 * p > n:
                break
            unit = b[i:i + p]
            k = 1
            while b[i + k * p:i + (k + 1) * p] == unit:
                k += 1
            if k >= 3 and k * p >= 8 and (best is None or k * p > best[0] * best[1]):
                best = (k, p)
        if best:
            if lit:
                out.append(lit.hex())
                lit = bytearray()
            k, p = best
            out.append(b[i:i + p].hex() + f"*{k}")
            i += k * p
        else:
            lit.append(b[i])
            i += 1
            if len(lit) == 32:
                out.append(lit.hex())
                lit = bytearray()
    if lit:
        out.append(lit.hex())
    return " ".join(out)


def decode_cases(enc, ranks, n_vocab, rng):
    by_rank = {r: t for t, r in ranks.items()}
    high = [ranks[bytes([b])] for b in range(0x80, 0x100)]
    partial = [r for r, t in by_rank.items() if t and (t[-1] & 0xC0 == 0xC0 or t[0] & 0xC0 == 0x80)]
    out = [("decode_empty", [])]
    for i in range(12):
        out.append((f"decode_random_{i:02d}", [rng.randrange(n_vocab) for _ in range(rng.randint(1, 24))]))
    for i in range(8):
        out.append((f"decode_high_bytes_{i:02d}", [rng.choice(high) for _ in range(rng.randint(1, 10))]))
    if partial:
        for i in range(6):
            out.append((f"decode_partial_{i:02d}", [rng.choice(partial) for _ in range(rng.randint(1, 10))]))
    # a character split over tokens, then cut short
    euro = [ranks[b"\xe2"], ranks[b"\x82"], ranks[b"\xac"]]
    out.append(("decode_split_char", euro + euro[:2] + [ranks[b"a"]] + euro[:1]))
    out.append(("decode_surrogate_bytes", [ranks[b"\xed"], ranks[b"\xa0"], ranks[b"\x80"]]))
    return out


def make_golden(name, path, layout):
    t0 = time.time()
    ranks = kimi_ref.load_ranks(os.path.join(ROOT, path))
    num_base = len(ranks)
    config = kimi_ref.tokenizer_config(num_base, layout)
    cpath = os.path.join(FIX, name + ".config.json")
    with open(os.path.join(ROOT, cpath), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    specials = kimi_ref.specials_of(num_base, config, layout)
    enc = kimi_ref.encoding(ranks, specials, name)
    lines = [
        f"# {name}: goldens by tools/tokenizer/make_goldens.py with tiktoken {__import__('tiktoken').__version__}",
        f"# E name special ids         (the input of each name is in {CASES}; ids: a,b*N repeats)",
        "# D name ids bytes text      (decode_bytes and decode(errors='replace') as hex)",
        f"ranks {path}",
        f"config {cpath}",
        f"slots {kimi_ref.LAYOUTS[layout][0]}",
    ]
    n_enc = 0
    for cname, raw, long in cases.cases():
        text = raw.decode("utf-8", "replace")
        for special in ([1] if long else [1, 0]):
            ids = kimi_ref.kimi_encode(enc, text, special)
            lines.append(f"E\t{cname}\t{special}\t{rle(ids, str)}")
            n_enc += 1
    rng = random.Random(sum(map(ord, name)))
    n_dec = 0
    for cname, ids in decode_cases(enc, ranks, enc.n_vocab, rng):
        lines.append(f"D\t{cname}\t{rle(ids, str)}\t{enc.decode_bytes(ids).hex()}\t{enc.decode(ids).encode('utf-8').hex()}")
        n_dec += 1
    gpath = os.path.join(ROOT, FIX, name + ".golden")
    with open(gpath, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{name}: {num_base} ranks, {n_enc} encode and {n_dec} decode cases -> {os.path.relpath(gpath, ROOT)} "
          f"({os.path.getsize(gpath)} bytes, {time.time() - t0:.1f} s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", action="store_true", help="retrain the rank files first")
    args = ap.parse_args()
    os.makedirs(os.path.join(ROOT, FIX), exist_ok=True)
    if args.train:
        train_all()
    with open(os.path.join(ROOT, CASES), "w", encoding="utf-8") as f:
        f.write("# the inputs of the tokenizer goldens (tools/tokenizer/cases.py): name, long (encoded with specials\n"
                "# allowed only), input bytes as hex words, HEX*N for a unit repeated N times\n")
        for cname, raw, long in cases.cases():
            f.write(f"{cname}\t{int(long)}\t{bytes_field(raw)}\n")
    for name, path, layout in FILES:
        make_golden(name, path, layout)


if __name__ == "__main__":
    main()
