"""The golden corpus of k3c's tokenizer: inputs that reach every branch of Kimi's pre-split pattern, the
PCRE2 pitfalls of spec tokenizer-chat.md 2.3, the Unicode 15-16 additions the generated pattern carries,
special-token text, ill-formed UTF-8 and the chunking limits. Each case is (name, input bytes, long):
long cases are encoded once (specials allowed), the others with specials on and off."""
import random

import kimi_ref

WHITE_SPACE = [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680] + list(range(0x2000, 0x200B)) + \
    [0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
# str.isspace() but not White_Space (so: spaces for the chunking rule, punctuation for the pattern), and
# look-alikes that are neither
ISSPACE_ONLY = [0x1C, 0x1D, 0x1E, 0x1F]
NOT_SPACE = [0x180E, 0x200B, 0x2060, 0xFEFF]

TEXT = [
    ("ascii_hello", "Hello world"),
    ("ascii_punct", "Hello, world!"),
    ("ascii_fox", "The quick brown fox."),
    ("code", "def foo(x): return x+1"),
    ("code_block", "int main(void) {\n\tprintf(\"%d\\n\", a[i] >= 0 ? a[i] : -1);\n\treturn 0;\n}\n"),
    ("spaces_tabs", "  spaces   and\ttabs\n"),
    ("mixed_k3", "Hello, Kernel Æther! The K3 model runs here. 你好世界"),
    ("camel", "getUserName iPhone HELLOWorld XMLHttpRequest parseHTTPResponse aB Ab AB ab"),
    ("camel_accents", "ÉcoleNormale çaVa ÅngströmÖl ÜberMäßig ǅungla ǈubica ǋ ǲ"),
    ("contractions", "I'm you're he's we've they'll she'd it'd isn't DON'T I'M Y'ALL'S o'clock 'tis"),
    ("contraction_edges", "'s 's's x's'd a'S B'T c'Re D'vE e'LL f'M g'D it'ſ IT'ſ 'x ''s s'"),
    ("digits", "1234567890 12 123 1234 12345 3.14159 1,000,000 x1y22z333w4444v55555"),
    ("digits_unicode", "١٢٣٤٥٦٧ ۱۲۳ ०१२३४ １２３４５ ²³¹ ½¾ ⅫⅣ 〇〡〢 ①②③ 𝟘𝟙𝟚𝟛"),
    ("cjk", "你好世界"),
    ("cjk_mixed", "中文English混合"),
    ("cjk_punct", "你好,世界!机器学习"),
    ("cjk_punct_full", "你好。世界、「测试」《三体》【注】〃·・‥…〜〖〗"),
    ("japanese", "日本語のテキストです。カタカナとひらがな、漢字を混ぜる。ｶﾀｶﾅ"),
    ("korean", "안녕하세요 세계! 한국어 텍스트입니다."),
    ("han_astral", "𠀀𠀁𪚥𫝀𬺰𰀀 \U00031350\U00031351\U000323AF \U0002EBF0\U0002EE5D \U0002B739"),
    ("han_radicals", "⺀⺁⼀⼁㐀㐁 〆〇〡 ㆒㆓ 々〻"),
    ("combining", "e\u0301 n\u0303 a\u0308\u0304 \u0301alone Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d"),
    ("indic", "नमस्ते दुनिया क्षत्रिय ಕನ್ನಡ தமிழ் ไทย สวัสดี ລາວ"),
    ("rtl", "مرحبا بالعالم שָׁלוֹם עוֹלָם ܫܠܡܐ"),
    ("greek_cyrillic", "ΑΒΓ αβγ Ωmega ΣίσυφοςΣ ПРИВЕТ мир ЁжИк Ґанок"),
    ("modifier_letters", "ʰʲ ˈstress ª º ˆx aʼb ꜝ ꟸꟹ ᵃᵇᶜ"),
    ("emoji", "😀👍🏽👨‍👩‍👧‍👦🇯🇵 ❤️ 1️⃣ #️⃣ 🏳️‍🌈 a😀b 😀😀😀"),
    ("symbols", "→ ← ⇒ ∀x∈ℝ: x² ≥ 0 © ® ™ € £ ¥ § ¶ † ‡ • ‰ ′ ″"),
    ("punct_runs", "!!!???...--- a+b=c; d->e <html><body>&amp; \"q\" 'q' `q` ~/x"),
    ("url_json", "https://example.com/a?b=1&c=2#d {\"k\": [1, 2.5, null, \"v\"]}"),
    ("crlf", "a\r\n\r\nb\n\n\nc\r\rd \n  e\t\n\tf  \r\n  g\n"),
    ("crlf_punct", "x.\n\n...\r\n!\ry?\n\n \n"),
    ("trailing_spaces", "word   \nword\t\t\nword \u3000\n   "),
    ("leading_spaces", "   leading\n\n  two\n \n\t\ttabs"),
    ("only_spaces", "     "),
    ("only_newlines", "\n\n\n\n"),
    ("controls", "a\x00b\x01c\x7fd\x1be\x08f"),
    ("specials_k2", "[BOS]hello<|im_end|><|im_user|>user<|im_middle|>hi[EOS] <think>r</think>"),
    ("specials_k3", "<|open|>message role=\"user\"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>"),
    ("specials_partial", "<|im_end <|open| [BOS [EOS]] <<|sep|>> <|<|close|>|> [[BOS]]"),
    ("specials_reserved", "<|reserved_token_0|> <|reserved_token_300|> <|reserved_token_999999|>"),
    ("specials_spaces", " <|im_end|> \n<|open|>\n [PAD] [UNK]"),
    ("specials_adjacent", "[BOS][BOS][EOS]<|sep|><|sep|>"),
    ("new_letters", "\U00010D50\U00010D70\U00010D51\U00010D71 \U00011F04\U00011F05 \U00016D43\U00016D44 "
                    "\U0001E5D0\U0001E5D1 \u1C89\u1C8A \uA7CB\uA7CD"),
    ("new_digits", "\U00010D40\U00010D41\U00010D42\U00010D43 \U0001E4F0\U0001E4F1 \U0001CCF0\U0001CCF1\U0001CCF2\U0001CCF3"),
    ("new_marks", "a\u0897b\u0CF3 \U00011F00\U00011F01x \U0001E4EC"),
    ("private_nonchar", "\uE000\uF8FF\U000F0000 \uFFFF\U0010FFFF\uFFFE \uFFFD"),
    ("bom", "\uFEFFtext\uFEFF"),
    ("mongolian_vs", "a\u180e! b\u180e c \u180e\u180e"),
]


def _random_text(rng, n):
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789", " \t\n\r", "'sStTdDmMlLrReEvV", ".,;:!?()[]{}<>|/\\\"-_=+*&^%$#@~`",
        "你好世界中文机器学习。、「」《》·", "日本語カタカナひらがな", "한국어텍스트", "ПриветМир", "αβγΔΣ",
        "éèêëçñüöäßÆØÅ", "\u0301\u0308\u0327", "😀👍🏽❤️‍🔥", "١٢٣٤", "\u00a0\u3000\u2003\u0085\u180e\x1c\u200b",
        "ǅǈǋ", "ʰʲˈ", "\U00020000\U0002A6A5\U00031350", "\U00010D50\U00010D70\U00011F04\U0001E4F0",
    ]
    specials = ["[BOS]", "<|im_end|>", "<|open|>", "<|sep|>", "<think>", "[EOS]", "<|reserved_token_5|>"]
    out = []
    while len(out) < n:
        r = rng.random()
        if r < 0.04:
            out.append(rng.choice(specials))
        elif r < 0.1:
            out.append(rng.choice(pools[rng.randrange(len(pools))]) * rng.randint(2, 6))
        else:
            pool = pools[rng.randrange(len(pools))]
            out.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
    return "".join(out)


def cases():
    out = [(name, s.encode("utf-8"), False) for name, s in TEXT]
    out.append(("empty", b"", False))
    for cp in WHITE_SPACE + ISSPACE_ONLY + NOT_SPACE:
        c = chr(cp)
        s = f"a{c}b {c}c{c}{c}d\n{c}e{c}\n{c}{c}"
        out.append((f"space_{cp:04x}", s.encode("utf-8"), False))
    # ill-formed UTF-8: read as bytes.decode("utf-8", "replace")
    bad = [
        ("bad_ff", b"\xff\xfe ok"), ("bad_cont", b"abc\x80def\xbf"), ("bad_c3", b"\xc3\x28 x"),
        ("bad_trunc3", b"\xe2\x82 euro"), ("bad_surrogate", b"\xed\xa0\x80\xed\xbf\xbf"),
        ("bad_above", b"\xf4\x90\x80\x80 \xf5\x80"), ("bad_overlong", b"\xc0\xaf\xe0\x80\xaf\xf0\x80\x80\xaf"),
        ("bad_end", b"hi\xe4\xbd"), ("bad_mixed", "你好".encode() + b"\xe4" + "世界".encode() + b"\xf0\x9f\x98"),
        ("bad_in_special", b"<|im_\xffend|> [BO\x80S]"),
    ]
    out += [(n, b, False) for n, b in bad]
    rng = random.Random(20261201)
    for i in range(24):
        out.append((f"random_{i:02d}", _random_text(rng, rng.randint(5, 60)).encode("utf-8"), False))
    # the chunking limits: runs past 25 000, windows past 400 000 code points
    R, W = kimi_ref.MAX_RUN_CHARS, kimi_ref.MAX_ENCODE_CHARS
    longs = [
        ("long_a", "a" * (2 * R + 17)),
        ("long_space", " " * (2 * R + 5) + "x"),
        ("long_newline", "\n" * (R + 3)),
        ("long_han", "你" * (R + 11)),
        ("long_e_acute", "é" * (R + 2)),
        ("long_emoji", "😀" * (R + 1)),
        ("long_digits", "7" * (R + 100)),
        ("long_isspace_only", "\x1c" * (R + 9)),
        ("long_mixed_run", ("ab" * R)[:R - 3] + "<|im_end|>tail"),  # the cut falls inside the special
        ("long_window", ("hello world " * (W // 12 + 100))),
        ("long_window_special", ("ab " * (W // 3 + 1))[:W - 4] + "<|im_end|> after"),  # special across the window
        ("long_window_exact", "xy " * (W // 3) + "z"),
    ]
    out += [(n, s.encode("utf-8"), True) for n, s in longs]
    return out
