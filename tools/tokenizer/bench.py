#!/usr/bin/env python3
"""Tokenizer encode speed, k3c beside Python tiktoken on the same ranks, pat_str and specials.

The text: the training corpus of train_bpe.py (common-licenses and message catalogues of Debian packages)
followed by the Debian changelogs under /usr/share/doc (*/changelog.Debian.gz, decompressed) up to
--mb megabytes. The ranks: src/text/data/default-32512.tiktoken with K3's specials (the tokenizer of the
synthesized presets). Both sides run one thread; each number is the best of --reps runs:
  - tiktoken: Encoding.encode(text, allowed_special="all") on the whole text (tiktoken alone), and Kimi's
    encode (kimi_ref.kimi_encode: the chunking loop in Python, then tiktoken per piece);
  - k3c: `k3c tokenize --model DIR --bench FILE` (the chunking included).
Then checks that `k3c tokenize --file` gives Kimi's ids for the whole text.

    python3 tools/tokenizer/bench.py [--k3c build/k3c] [--mb 16] [--reps 3]"""
import argparse
import glob
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kimi_ref  # noqa: E402
import make_goldens  # noqa: E402
import train_bpe  # noqa: E402


def build_text(mb):
    parts = [t for _, t in train_bpe.corpus_texts()]
    size = sum(len(p.encode()) for p in parts)
    for p in sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz")):
        if size >= mb * 1e6:
            break
        try:
            with gzip.open(p, "rt", encoding="utf-8", errors="replace") as f:
                t = f.read()
        except OSError:
            continue
        parts.append(t)
        size += len(t.encode())
    return "\n".join(parts)


def best(fn, reps):
    """(best wall time, best thread CPU time, result): on a shared machine the CPU time is the fair number."""
    wall, cpu = [], []
    for _ in range(reps):
        c0, t0 = time.thread_time(), time.perf_counter()
        out = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return min(wall), min(cpu), out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k3c", default=os.path.join(make_goldens.ROOT, "build", "k3c"))
    ap.add_argument("--mb", type=float, default=16)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import tiktoken
    text = build_text(args.mb)
    data = text.encode("utf-8")
    mb = len(data) / 1e6
    tmp = tempfile.mkdtemp(prefix="k3c-tok-bench-")
    try:
        d = os.path.join(tmp, "model")
        os.makedirs(d)
        shutil.copy(os.path.join(make_goldens.ROOT, make_goldens.DEFAULT), os.path.join(d, "tiktoken.model"))
        shutil.copy(os.path.join(make_goldens.ROOT, make_goldens.FIX, "default-32512.config.json"),
                    os.path.join(d, "tokenizer_config.json"))
        f = os.path.join(tmp, "bench.txt")
        with open(f, "wb") as fh:
            fh.write(data)
        ranks = kimi_ref.load_ranks(os.path.join(d, "tiktoken.model"))
        config = kimi_ref.load_config(os.path.join(d, "tokenizer_config.json"))
        enc = kimi_ref.encoding(ranks, kimi_ref.specials_of(len(ranks), config, "k3"))
        print(f"text: {mb:.2f} MB ({len(text)} code points); ranks {make_goldens.DEFAULT} ({len(ranks)}), "
              f"tiktoken {tiktoken.__version__}")
        t_tk, c_tk, ids_tk = best(lambda: enc.encode(text, allowed_special="all"), args.reps)
        print(f"tiktoken encode (whole text, one thread):       wall {t_tk:7.3f} s {mb / t_tk:7.2f} MB/s, "
              f"CPU {c_tk:7.3f} s {mb / c_tk:7.2f} MB/s  ({len(ids_tk)} ids)")
        t_kimi, c_kimi, ids = best(lambda: kimi_ref.kimi_encode(enc, text, True), args.reps)
        print(f"Kimi encode on tiktoken (chunking in Python):  wall {t_kimi:7.3f} s {mb / t_kimi:7.2f} MB/s, "
              f"CPU {c_kimi:7.3f} s {mb / c_kimi:7.2f} MB/s  ({len(ids)} ids)")
        p = subprocess.run([args.k3c, "tokenize", "--model", d, "--bench", f], capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout + p.stderr)
            return 1
        m = re.search(r"encode: ([0-9.]+) s = [0-9.]+ MB/s .*CPU time ([0-9.]+) s", p.stdout)
        t_c, c_c = float(m.group(1)), float(m.group(2))
        print(f"k3c encode (k3c tokenize --bench, one thread): wall {t_c:7.3f} s {mb / t_c:7.2f} MB/s, "
              f"CPU {c_c:7.3f} s {mb / c_c:7.2f} MB/s")
        print(f"k3c / Kimi-on-tiktoken: {c_kimi / c_c:.1f}x by CPU time ({t_kimi / t_c:.1f}x wall); "
              f"k3c / tiktoken alone: {c_tk / c_c:.1f}x by CPU time ({t_tk / t_c:.1f}x wall)")
        for line in p.stdout.splitlines()[1:]:
            print("  k3c " + line)
        p = subprocess.run([args.k3c, "tokenize", "--model", d, "--file", f], capture_output=True, text=True)
        got = [int(x) for x in p.stdout.split()]
        same = got == ids
        print(f"ids of the whole text: k3c {'==' if same else '!='} Kimi-on-tiktoken ({len(got)} vs {len(ids)})")
        return 0 if same else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
