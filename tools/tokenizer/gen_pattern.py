#!/usr/bin/env python3
"""Generates src/text/pretok_pattern.h: Kimi's pre-split pattern rewritten for PCRE2 and widened to the
reference's Unicode tables, and proves the rewrite class by class against the reference engine.

Why: tiktoken (fancy-regex on regex 1.13) reads the pattern with Unicode 16 tables and `&&` intersection;
PCRE2 10.42 (Debian 12) has Unicode 14 tables, no `&&`, Script_Extensions for bare \\p{Han} and U+180E in
UCP \\s (spec 2.3). The spec's rewrite fixes the syntax; this script adds, to every class, the code points
the reference puts in it and PCRE2 does not (Unicode 15.0-16.0 additions), and fails if PCRE2 puts any code
point in a class the reference does not. Each class is compared over every code point, the reference's set
read from tiktoken itself: an Encoding whose pattern is just that class skips every unmatched character, so
encoding all code points returns exactly the matched ones.

Run where tiktoken 0.14 and libpcre2-8 are installed: python3 tools/tokenizer/gen_pattern.py"""
import ctypes
import os
import sys

import tiktoken

sys.path.insert(0, os.path.dirname(__file__))

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "src", "text", "pretok_pattern.h")

CPS = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
ALL = "".join(map(chr, CPS))
BYTES = {bytes([i]): i for i in range(256)}


def ref_set(pat):
    enc = tiktoken.Encoding("probe", pat_str=pat, mergeable_ranks=BYTES, special_tokens={})
    return set(map(ord, bytes(enc.encode_ordinary(ALL)).decode("utf-8")))


pc = ctypes.CDLL("libpcre2-8.so.0")
pc.pcre2_compile_8.restype = ctypes.c_void_p
pc.pcre2_compile_8.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.POINTER(ctypes.c_int),
                               ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
pc.pcre2_match_data_create_8.restype = ctypes.c_void_p
pc.pcre2_match_data_create_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
pc.pcre2_match_8.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint32,
                             ctypes.c_void_p, ctypes.c_void_p]
pc.pcre2_get_ovector_pointer_8.restype = ctypes.POINTER(ctypes.c_size_t)
pc.pcre2_get_ovector_pointer_8.argtypes = [ctypes.c_void_p]
pc.pcre2_config_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
PCRE2_UTF, PCRE2_UCP, PCRE2_NO_UTF_CHECK = 0x00080000, 0x00020000, 0x40000000
PCRE2_CONFIG_UNICODE_VERSION = 10


def pcre2_unicode_version():
    buf = ctypes.create_string_buffer(32)
    pc.pcre2_config_8(PCRE2_CONFIG_UNICODE_VERSION, buf)
    return buf.value.decode()


def pcre_compile(pat):
    e, o = ctypes.c_int(), ctypes.c_size_t()
    p = pat.encode()
    code = pc.pcre2_compile_8(p, len(p), PCRE2_UTF | PCRE2_UCP, ctypes.byref(e), ctypes.byref(o), None)
    if not code:
        sys.exit(f"gen_pattern: PCRE2 refuses {pat[:80]!r}: error {e.value} at {o.value}")
    return code


def pcre_set(pat):
    code = pcre_compile("(?:" + pat + ")+")
    md = pc.pcre2_match_data_create_8(2, None)
    ov = pc.pcre2_get_ovector_pointer_8(md)
    b = ALL.encode()
    s, pos = set(), 0
    while pc.pcre2_match_8(code, b, len(b), pos, PCRE2_NO_UTF_CHECK, md, None) >= 0:
        st, en = ov[0], ov[1]
        s.update(map(ord, b[st:en].decode()))
        pos = en
    return s


def ranges(s):
    out = []
    for c in sorted(s):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def class_text(s):
    return "".join(f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in ranges(s))


# White_Space spelled out: UCP \s also matches U+180E (spec 2.3.3).
WS = r"\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}"


def main():
    props = {"Han": (r"\p{Han}", r"\p{sc=Han}")}
    for p in ("Lu", "Lt", "Lm", "Lo", "Ll", "M", "L", "N"):
        props[p] = (rf"\p{{{p}}}", rf"\p{{{p}}}")
    delta = {}
    for name, (ref, pcre) in props.items():
        r, p = ref_set(ref), pcre_set(pcre)
        if p - r:
            sys.exit(f"gen_pattern: PCRE2's {pcre} holds {len(p - r)} code points the reference's {ref} does not "
                     f"(first {min(p - r):#x}): a delta cannot fix that")
        delta[name] = r - p
        print(f"{name}: reference {len(r)}, PCRE2 {len(p)}, added {len(r - p)} in {len(ranges(r - p))} ranges")
    d = {k: class_text(v) for k, v in delta.items()}
    han = rf"[\p{{sc=Han}}{d['Han']}]"
    upper = rf"[\p{{Lu}}\p{{Lt}}\p{{Lm}}\p{{Lo}}\p{{M}}{d['Lu']}{d['Lt']}{d['Lm']}{d['Lo']}{d['M']}]"
    lower = rf"[\p{{Ll}}\p{{Lm}}\p{{Lo}}\p{{M}}{d['Ll']}{d['Lm']}{d['Lo']}{d['M']}]"
    ln = rf"\p{{L}}\p{{N}}{d['L']}{d['N']}"
    num = rf"[\p{{N}}{d['N']}]"
    upper_nh = rf"(?:(?!{han}){upper})"
    lower_nh = rf"(?:(?!{han}){lower})"
    contr = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    lead = rf"[^\r\n{ln}]?"
    parts = [
        rf"{han}+",
        rf"{lead}{upper_nh}*{lower_nh}+{contr}",
        rf"{lead}{upper_nh}+{lower_nh}*{contr}",
        rf"{num}{{1,3}}",
        rf" ?[^{WS}{ln}]+[\r\n]*",
        rf"[{WS}]*[\r\n]+",
        rf"[{WS}]+(?![^{WS}])",
        rf"[{WS}]+",
    ]
    # every class of the pattern, reference spelling beside the rewrite: equal over all code points
    checks = [
        (r"[\p{Han}]", han),
        (r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]", upper_nh),
        (r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]", lower_nh),
        (r"[^\r\n\p{L}\p{N}]", lead[:-1]),
        (r"\p{N}", num),
        (r"[^\s\p{L}\p{N}]", rf"[^{WS}{ln}]"),
        (r"\s", rf"[{WS}]"),
        (r"\S", rf"[^{WS}]"),
    ]
    for c in "strevmld":
        checks.append((f"(?i:{c})", f"(?i:{c})"))
    for ref, pcre in checks:
        r, p = ref_set(ref), pcre_set(pcre)
        if r != p:
            sys.exit(f"gen_pattern: {ref} differs: reference-only {sorted(r - p)[:8]}, PCRE2-only {sorted(p - r)[:8]}")
        print(f"equal over all code points: {ref} ({len(r)})")
    pat = "|".join(parts)
    pcre_compile(pat)
    uv = pcre2_unicode_version()
    lines = [
        "/* Generated by tools/tokenizer/gen_pattern.py: do not edit. Kimi's pre-split pattern (pat_str of",
        " * tokenization_kimi.py) rewritten for PCRE2 (spec tokenizer-chat.md 2.3: `&&` as a negative lookahead,",
        " * \\p{sc=Han}, White_Space spelled out) and widened to the reference's Unicode tables: every class below",
        " * was checked, over all code points, to match exactly the code points tiktoken 0.14's engine puts in",
        f" * the original class, with PCRE2 {uv} Unicode tables. */",
        "#ifndef K3C_TEXT_PRETOK_PATTERN_H",
        "#define K3C_TEXT_PRETOK_PATTERN_H",
        "",
        f'#define K3C_PRETOK_PCRE2_UNICODE "{uv}"',
        "",
        "static const char k3c_pretok_pattern[] =",
    ]
    for i, part in enumerate(parts):
        sep = "|" if i + 1 < len(parts) else ""
        # long literals split between items of the pattern, never inside a C escape
        chunks, cur = [], ""
        for k, ch in enumerate(part):
            if len(cur) >= 96 and ch == "\\" and part[k - 1] in "}]":  # before an escape that starts an item
                chunks.append(cur)
                cur = ""
            cur += {"\\": "\\\\", '"': '\\"'}.get(ch, ch)
        if cur or not chunks:
            chunks.append(cur)
        for j, ch in enumerate(chunks):
            tail = sep if j + 1 == len(chunks) else ""
            lines.append(f'    "{ch}{tail}"')
    lines[-1] += ";"
    lines += ["", "#endif", ""]
    with open(OUT, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {os.path.normpath(OUT)} ({len(pat)} pattern bytes)")


if __name__ == "__main__":
    main()
