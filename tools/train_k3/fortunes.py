"""The training text: fortune cookies from Debian's fortune data packages.

A fortune file is plain text with one cookie per record and a line holding only "%" between records (strfile's
format). Each record becomes one document, cleaned of terminal escapes (fortunes-zh colours its text with ANSI
SGR sequences), nroff overstrikes (x BACKSPACE x), carriage returns and other control characters, with trailing
blanks removed from every line. Documents are deduplicated (some cookies sit in several files) and assigned to
train / valid / heldout by a hash of their text, so the split does not depend on file order or on which packages
are installed beside the ones named here.
"""
import hashlib
import os
import re
import unicodedata

FORTUNE_DIR = "/usr/share/games/fortunes"
# Debian packages and the files each installs under FORTUNE_DIR (dpkg -L, Debian 12: fortunes 1:1.99.1-7.3,
# fortunes-min 1:1.99.1-7.3, fortunes-zh 2.98).
PACKAGES = {
    "fortunes-min": ["fortunes", "literature", "riddles"],
    "fortunes": [
        "art", "ascii-art", "computers", "cookie", "debian", "definitions", "disclaimer", "drugs", "education",
        "ethnic", "food", "goedel", "humorists", "kids", "knghtbrd", "law", "linux", "linuxcookie", "love",
        "magic", "medicine", "men-women", "miscellaneous", "news", "paradoxum", "people", "perl", "pets",
        "platitudes", "politics", "pratchett", "science", "songs-poems", "sports", "startrek", "tao",
        "translate-me", "wisdom", "work", "zippy",
    ],
    "fortunes-zh": ["chinese", "song100", "tang300"],
}

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_OVERSTRIKE = re.compile(r".\x08")


def clean(text):
    text = _ANSI.sub("", text)
    while "\x08" in text:
        new = _OVERSTRIKE.sub("", text)
        if new == text:
            text = text.replace("\x08", "")
            break
        text = new
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    out = []
    for ch in text:
        if ch in "\n\t" or unicodedata.category(ch)[0] != "C":
            out.append(ch)
    lines = [ln.rstrip() for ln in "".join(out).split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def read_file(path):
    with open(path, "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8", errors="replace")
    docs, cur = [], []
    for line in text.split("\n"):
        if line.rstrip("\r") == "%":
            docs.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    docs.append("\n".join(cur))
    return [d for d in (clean(x) for x in docs) if d]


def collect(fortune_dir=FORTUNE_DIR):
    """[(package, file, document)] for every package file present, deduplicated (first occurrence kept)."""
    seen, out = set(), []
    for pkg, files in PACKAGES.items():
        for name in files:
            path = os.path.join(fortune_dir, name)
            if not os.path.isfile(path):
                continue
            for d in read_file(path):
                if d in seen:
                    continue
                seen.add(d)
                out.append((pkg, name, d))
    return out


def split_of(doc, valid_permille, heldout_permille):
    h = int.from_bytes(hashlib.sha256(doc.encode("utf-8")).digest()[:4], "little") % 1000
    if h < heldout_permille:
        return "heldout"
    if h < heldout_permille + valid_permille:
        return "valid"
    return "train"


# Documents are joined the way a fortune file joins them: a line holding "%" after each one. The training
# stream, the valid / heldout files and the perplexity evaluation all use this one format.
SEPARATOR = "\n%\n"


def join(docs):
    return "".join(d + SEPARATOR for d in docs)


def split_docs(text):
    parts = text.split(SEPARATOR)
    if parts and parts[-1] == "":
        parts.pop()
    return parts
