#!/usr/bin/env python3
"""Randomized exactness check of k3c's tokenizer against Python tiktoken: fresh random strings (every
script and space class of Kimi's pattern, special-token text, ill-formed UTF-8, any code point), each
encoded by `k3c tokenize --model DIR --file F` and by tiktoken with the same ranks, pat_str and specials
(kimi_ref.py), with specials allowed and not; then random ids through `k3c detokenize` against tiktoken's
decode. Rank files: the committed test files (tests/fixtures/tokenizer, src/text/data).

    python3 tools/tokenizer/random_check.py [--k3c build/k3c] [-n 120] [--seed S]

Prints the seed (a failure replays with --seed) and the counts; exits 1 on the first difference, showing
the input and both id lists."""
import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kimi_ref  # noqa: E402
import make_goldens  # noqa: E402

ROOT = make_goldens.ROOT
FILES = [f for f in make_goldens.FILES if f[0] in ("train-4096", "shuffled-2048", "default-32512")]

RANGES = [  # (weight, low, high)
    (30, 0x20, 0x7E), (6, 0x09, 0x0D), (3, 0x1C, 0x20), (4, 0xA0, 0xFF), (3, 0x100, 0x24F), (2, 0x250, 0x2FF),
    (3, 0x300, 0x36F), (3, 0x370, 0x3FF), (3, 0x400, 0x4FF), (2, 0x590, 0x6FF), (2, 0x900, 0x97F),
    (2, 0xE00, 0xE7F), (2, 0x1C80, 0x1C8F), (2, 0x2000, 0x206F), (2, 0x2070, 0x218F), (3, 0x3000, 0x303F),
    (3, 0x3040, 0x30FF), (8, 0x4E00, 0x9FFF), (3, 0xAC00, 0xD7A3), (2, 0xA7C0, 0xA7DF), (2, 0xFF00, 0xFFEF),
    (2, 0x1F300, 0x1FAFF), (2, 0x20000, 0x2A6DF), (2, 0x2EBF0, 0x2EE5D), (2, 0x31350, 0x323AF),
    (2, 0x10D40, 0x10D8F), (2, 0x11F00, 0x11F5F), (2, 0x1E4D0, 0x1E5FF), (1, 0x1CCF0, 0x1CCF9),
    (2, 0x0, 0x10FFFF),
]
SPACES = [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x2005, 0x200A, 0x2028, 0x2029, 0x202F,
          0x205F, 0x3000, 0x1C, 0x1F, 0x180E, 0x200B, 0xFEFF]
SPECIAL_TEXT = ["[BOS]", "[EOS]", "<|im_end|>", "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "<think>",
                "</think>", "<|reserved_token_7|>", "<|im_", "[PAD]"]
PIECES = ["'s", "'T", "'re", "'VE", "'ll", "'d", "'m", "'ſ", "\r\n", "\n\n", "  ", "123456", "getUserName",
          "HTTPServer", "é", "e\u0301", "👨‍👩‍👧", "❤️", "你好。", "「测试」", "·"]


def random_cp(rng):
    while True:
        w = rng.random() * TOTAL
        for weight, lo, hi in RANGES:
            w -= weight
            if w <= 0:
                break
        c = rng.randint(lo, hi)
        if not 0xD800 <= c < 0xE000:
            return chr(c)


TOTAL = sum(r[0] for r in RANGES)


def random_input(rng):
    """Bytes (sometimes ill-formed UTF-8)."""
    parts = []
    for _ in range(rng.randint(1, 40)):
        r = rng.random()
        if r < 0.55:
            parts.append("".join(random_cp(rng) for _ in range(rng.randint(1, 6))).encode())
        elif r < 0.7:
            parts.append("".join(chr(rng.choice(SPACES)) for _ in range(rng.randint(1, 5))).encode())
        elif r < 0.8:
            parts.append(rng.choice(SPECIAL_TEXT).encode())
        elif r < 0.9:
            parts.append(rng.choice(PIECES).encode())
        elif r < 0.95:
            parts.append((random_cp(rng) * rng.randint(2, 30)).encode())
        else:
            parts.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 4))))
    return b"".join(parts)


def long_input(rng):
    """25 000 to 60 000 code points: random text with one long run (of one character, of spaces, of a
    mixed non-space run) placed so that Kimi's 25 000-character cut falls somewhere inside it."""
    head = "".join(random_cp(rng) if rng.random() < 0.7 else " " for _ in range(rng.randint(0, 3000)))
    c = rng.choice(["a", " ", "\n", "é", "你", "7", "!", "\x1c", "\u3000", random_cp(rng)])
    run = c * rng.randint(24990, 26000) if rng.random() < 0.6 else \
        "".join(rng.choice("ab.,-_你é") for _ in range(rng.randint(24990, 26000)))
    if rng.random() < 0.5:  # a special text across the cut
        k = rng.randint(24990, len(run))
        run = run[:k] + rng.choice(SPECIAL_TEXT) + run[k:]
    tail = "".join(random_cp(rng) for _ in range(rng.randint(0, 2000)))
    return (head + run + tail).encode()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k3c", default=os.path.join(ROOT, "build", "k3c"))
    ap.add_argument("-n", type=int, default=120, help="random strings per rank file")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--long", type=int, default=2, help="long strings (past the 25 000 cut) per rank file")
    args = ap.parse_args()
    import tiktoken
    seed = args.seed if args.seed is not None else int(time.time() * 1000) % (1 << 31)
    print(f"tokenizer random check: tiktoken {tiktoken.__version__}, seed {seed}")
    rng = random.Random(seed)
    tmp = tempfile.mkdtemp(prefix="k3c-tok-random-")
    try:
        for name, path, layout in FILES:
            d = os.path.join(tmp, name)
            os.makedirs(d)
            shutil.copy(os.path.join(ROOT, path), os.path.join(d, "tiktoken.model"))
            shutil.copy(os.path.join(ROOT, make_goldens.FIX, name + ".config.json"), os.path.join(d, "tokenizer_config.json"))
            ranks = kimi_ref.load_ranks(os.path.join(d, "tiktoken.model"))
            config = kimi_ref.load_config(os.path.join(d, "tokenizer_config.json"))
            enc = kimi_ref.encoding(ranks, kimi_ref.specials_of(len(ranks), config, layout))
            f = os.path.join(tmp, "input")
            equal = 0
            for i in range(args.n + args.long):
                raw = random_input(rng) if i < args.n else long_input(rng)
                special = i % 2 == 0
                with open(f, "wb") as fh:
                    fh.write(raw)
                want = kimi_ref.kimi_encode(enc, raw.decode("utf-8", "replace"), special)
                cmd = [args.k3c, "tokenize", "--model", d, "--file", f] + ([] if special else ["--no-special"])
                p = subprocess.run(cmd, capture_output=True, text=True)
                got = [int(x) for x in p.stdout.split()] if p.returncode == 0 else None
                if got != want:
                    k = next((j for j in range(min(len(want), len(got or []))) if want[j] != got[j]), None)
                    shown = raw.hex() if len(raw) < 4000 else f"{len(raw)} bytes, {raw[:200].hex()}..."
                    print(f"MISMATCH {name} case {i} (seed {seed}, specials {'on' if special else 'off'})\n"
                          f"  input (hex): {shown}\n  tiktoken: {len(want)} ids {want[max(0, (k or 0) - 5):(k or 0) + 5]}\n"
                          f"  k3c:      {len(got or [])} ids {(got or [])[max(0, (k or 0) - 5):(k or 0) + 5]} (around the difference)\n"
                          f"  first difference at id {k}; k3c stderr: {p.stderr.strip()}")
                    return 1
                equal += 1
            dec = 0
            for i in range(args.n // 4):
                ids = [rng.randrange(enc.n_vocab) for _ in range(rng.randint(1, 12))]
                want = enc.decode(ids) + "\n"
                p = subprocess.run([args.k3c, "detokenize", "--model", d, "--ids", ",".join(map(str, ids))],
                                   capture_output=True)
                if p.returncode != 0 or p.stdout != want.encode():
                    print(f"MISMATCH {name} decode of {ids} (seed {seed}): tiktoken {want.encode()!r}, k3c {p.stdout!r} "
                          f"{p.stderr.decode(errors='replace').strip()}")
                    return 1
                dec += 1
            print(f"  {name}: {equal}/{args.n + args.long} random strings ({args.long} long) equal id for id, "
                  f"{dec}/{args.n // 4} decodes equal")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
