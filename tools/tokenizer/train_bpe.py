#!/usr/bin/env python3
"""A small byte-level BPE trainer for k3c's test rank files (tiktoken.model format), in the manner of
tiktoken's educational trainer (tiktoken/_educational.py, train_simple_encoding) but incremental: words
are the pieces of Kimi's pre-split pattern over the corpus, counted once; each step merges the most
frequent adjacent pair (ties: the pair of lowest ids), and only the words holding that pair are
rewritten. Ranks 0..255 are the single bytes in a given order; rank 256 + k is the k-th merge.

The corpus is text that Debian packages ship (so anyone can rebuild it from the same packages):
  - /usr/share/common-licenses/* (package base-files): English;
  - the message catalogues /usr/share/locale/<lang>/LC_MESSAGES/<domain>.mo of coreutils, dpkg, apt,
    bash, findutils, grep and diffutils (shipped in those packages): the translated strings (msgstr) of
    zh_CN, zh_TW, ja, ko, ru, uk, de, fr, es, pt_BR, it, pl, vi, and the English originals (msgid) once.
"""
import collections
import glob
import heapq
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(__file__))
import kimi_ref  # noqa: E402

LANGS = ["zh_CN", "zh_TW", "ja", "ko", "ru", "uk", "de", "fr", "es", "pt_BR", "it", "pl", "vi"]
DOMAINS = ["coreutils", "dpkg", "apt", "bash", "findutils", "grep", "diffutils"]


def gpt2_byte_order():
    """GPT-2's bytes_to_unicode order: the printable bytes first, then the rest in byte order (the order
    the published Kimi ranks 0..255 follow: '!' = 0, '\\n' = 198, ' ' = 220)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    return bs + [b for b in range(256) if b not in bs]


def read_mo(path):
    """(msgid, msgstr) pairs of a GNU .mo file (either byte order), as text."""
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack("<I", data[:4])[0]
    e = "<" if magic == 0x950412DE else ">"
    _, n, orig, trans = struct.unpack(e + "4I", data[4:20])
    out = []
    for i in range(n):
        ol, oo = struct.unpack(e + "2I", data[orig + 8 * i:orig + 8 * i + 8])
        tl, to = struct.unpack(e + "2I", data[trans + 8 * i:trans + 8 * i + 8])
        out.append((data[oo:oo + ol].decode("utf-8", "replace"), data[to:to + tl].decode("utf-8", "replace")))
    return out


def corpus_texts():
    """The corpus, as a list of (source, text)."""
    texts = []
    seen = set()
    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        real = os.path.realpath(p)
        if real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        with open(real, encoding="utf-8", errors="replace") as f:
            texts.append((p, f.read()))
    english_done = set()
    for lang in LANGS:
        for dom in DOMAINS:
            p = f"/usr/share/locale/{lang}/LC_MESSAGES/{dom}.mo"
            if not os.path.isfile(p):
                continue
            pairs = read_mo(p)
            texts.append((p, "\n".join(s.replace("\x00", "\n") for _, s in pairs if s)))
            if dom not in english_done:
                english_done.add(dom)
                texts.append((p + " (msgid)", "\n".join(i.replace("\x00", "\n") for i, _ in pairs if i)))
    return texts


def count_words(texts):
    import regex
    pat = regex.compile(kimi_ref.PAT_STR, regex.V1)
    words = collections.Counter()
    for _, t in texts:
        for m in pat.finditer(t):
            words[m.group().encode("utf-8")] += 1
    return words


def train(words, byte_order, n_ranks, log=None):
    """Returns the rank list (byte strings, index = rank), n_ranks long (or shorter when no pair is left)."""
    vocab = [bytes([b]) for b in byte_order]
    id_of = {v: i for i, v in enumerate(vocab)}
    seqs = [[id_of[bytes([b])] for b in w] for w in words]
    counts = list(words.values())
    pair_count = collections.defaultdict(int)
    where = collections.defaultdict(set)
    for wi, s in enumerate(seqs):
        c = counts[wi]
        for p in zip(s, s[1:]):
            pair_count[p] += c
            where[p].add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    while len(vocab) < n_ranks and heap:
        negc, p = heapq.heappop(heap)
        if pair_count.get(p, 0) != -negc or negc == 0:
            continue
        new = len(vocab)
        vocab.append(vocab[p[0]] + vocab[p[1]])
        a, b = p
        changed = set()
        for wi in where.pop(p):
            s = seqs[wi]
            if len(s) < 2:
                continue
            c = counts[wi]
            merged, i, hit = [], 0, False
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    merged.append(new)
                    i += 2
                    hit = True
                else:
                    merged.append(s[i])
                    i += 1
            if not hit:
                continue
            for q in zip(s, s[1:]):
                pair_count[q] -= c
                changed.add(q)
            for q in zip(merged, merged[1:]):
                pair_count[q] += c
                where[q].add(wi)
                changed.add(q)
            seqs[wi] = merged
        pair_count.pop(p, None)
        for q in changed:
            c = pair_count.get(q, 0)
            if c > 0:
                heapq.heappush(heap, (-c, q))
            elif q in pair_count:
                del pair_count[q]
        if log and len(vocab) % 4096 == 0:
            log(f"  {len(vocab)} ranks")
    return vocab


if __name__ == "__main__":
    import time
    t0 = time.time()
    texts = corpus_texts()
    words = count_words(texts)
    print(f"{len(texts)} texts, {sum(len(t) for _, t in texts)} chars, {len(words)} distinct words "
          f"({time.time() - t0:.1f} s)")
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    ranks = train(words, gpt2_byte_order(), n, log=print)
    print(f"{len(ranks)} ranks in {time.time() - t0:.1f} s; last: {ranks[-5:]}")
