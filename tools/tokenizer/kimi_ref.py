"""The reference side of k3c's tokenizer checks: Kimi's tokenizer rebuilt from the spec
(shared/spec/tokenizer-chat.md section 1) on Python tiktoken, for any rank file in the tiktoken.model format.

Kimi's tokenization_kimi.py constructs tiktoken.Encoding(pat_str=PAT_STR, mergeable_ranks=<tiktoken.model>,
special_tokens={name: id for the slots after the base ranks}); its encode() cuts the text into windows of
400 000 code points and those into pieces without runs of more than 25 000 str.isspace() or non-space
characters, and encodes every piece on its own with allowed_special="all" (or disallowed_special=() when
specials are off). This module is that, nothing more, so goldens and random checks share one definition."""
import base64
import json

PAT_STR = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

MAX_ENCODE_CHARS = 400_000
MAX_RUN_CHARS = 25_000

# Named special slots, as offsets after the base ranks (spec 1.1; the K2 table is the 5-table consensus,
# K3's the 4-table one). Every other slot is <|reserved_token_{id}|>.
K2_NAMES = {
    0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
    6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>", 17: "<|im_middle|>",
    18: "<|media_start|>", 19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>",
    22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]",
}
K3_NAMES = {
    0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
    6: "[start_header_id]", 7: "[end_header_id]", 9: "[EOT]", 254: "[UNK]", 255: "[PAD]",
}
LAYOUTS = {"k2": (258, K2_NAMES), "k3": (256, K3_NAMES)}


def load_ranks(path):
    """tiktoken.load.load_tiktoken_bpe without the cache: {bytes: rank}."""
    with open(path, "rb") as f:
        return {base64.b64decode(tok): int(rank) for tok, rank in (l.split() for l in f.read().splitlines() if l)}


def write_ranks(path, ranks):
    """ranks: list of byte strings, index = rank."""
    with open(path, "wb") as f:
        for i, tok in enumerate(ranks):
            f.write(base64.b64encode(tok) + b" " + str(i).encode() + b"\n")


def tokenizer_config(num_base, layout):
    """A tokenizer_config.json of the published shape: added_tokens_decoder for the named slots, and the
    bos / eos / pad / unk names."""
    slots, names = LAYOUTS[layout]
    added = {}
    for off, name in sorted(names.items()):
        added[str(num_base + off)] = {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": True}
    return {
        "added_tokens_decoder": added,
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "model_max_length": 1048576,
        "tokenizer_class": "TikTokenTokenizer",
    }


def specials_of(num_base, config, layout):
    """TK-L / TK-3: {added_tokens_decoder[i].content or <|reserved_token_i|>: i} over the layout's slots."""
    slots = LAYOUTS[layout][0]
    named = {int(k): v["content"] for k, v in config.get("added_tokens_decoder", {}).items()}
    return {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(num_base, num_base + slots)}


def encoding(ranks, specials, name="k3c-ref"):
    import tiktoken
    return tiktoken.Encoding(name=name, pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=specials)


def split_runs(s, limit=MAX_RUN_CHARS):
    """_split_whitespaces_or_nonwhitespaces: pieces without more than `limit` consecutive str.isspace() or
    non-space characters."""
    run = 0
    is_space = s[0].isspace() if s else False
    start = 0
    for i, ch in enumerate(s):
        now = ch.isspace()
        if is_space ^ now:
            run = 1
            is_space = now
        else:
            run += 1
            if run > limit:
                yield s[start:i]
                start = i
                run = 1
    yield s[start:]


def kimi_encode(enc, text, allow_special):
    out = []
    for i in range(0, len(text), MAX_ENCODE_CHARS):
        for piece in split_runs(text[i:i + MAX_ENCODE_CHARS]):
            if allow_special:
                out.extend(enc.encode(piece, allowed_special="all"))
            else:
                out.extend(enc.encode(piece, disallowed_special=()))
    return out


def load_config(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)
