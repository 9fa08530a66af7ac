"""Byte-level BPE in the Kimi tokenizer file format (tokenizer-chat.md §1-§2).

Files written beside the checkpoint, as a published Kimi checkpoint ships them:
  tiktoken.model         one "<base64 bytes> <rank>" line per base token; the rank is the id and the merge priority
  tokenizer_config.json  added_tokens_decoder with the 256 K3 special slots after the base ranks, bos / eos / pad / unk
Ranks 0..255 are the 256 single bytes in GPT-2's bytes_to_unicode order (so "!" = 0, "\\n" = 198, " " = 220, as in
the Kimi files); the merges come after them in the order the trainer made them.

The vocabulary is chosen by the `tokenizers` BPE trainer on the text split by the Kimi pre-split pattern; the
tokenizer itself is what Python `tiktoken` does with these ranks and that pattern (lowest-rank merge first), and
`verify` checks that the two agree on the training text. Encoding for training always goes through `tiktoken`.
"""
import base64
import json
import os

# Kimi's pat_str (tokenizer-chat.md §2.1): the eight alternatives joined with "|".
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

NUM_SPECIAL = 256  # K3: 256 slots after the base ranks (Kimi Linear / K2 have 258)
# K3's named specials by offset from the first special id (tokenizer-chat.md §1.1, K3 ids: 163584 + offset).
K3_SPECIALS = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|end_of_msg|>",
    3: "<|open|>",
    4: "<|close|>",
    5: "<|sep|>",
    6: "[start_header_id]",
    7: "[end_header_id]",
    9: "[EOT]",
    21: "<|kimi_image_placeholder|>",  # config.json media_placeholder_token_id = 163605
    254: "[UNK]",
    255: "[PAD]",
}
BOS_OFFSET, EOS_OFFSET, END_OF_MSG_OFFSET, PAD_OFFSET = 0, 1, 2, 255


def gpt2_byte_order():
    """The 256 byte values in GPT-2 bytes_to_unicode order: rank r is the single byte order[r]."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    rest = [b for b in range(256) if b not in bs]
    return bs + rest


def _byte_decoder():
    """tokenizers' ByteLevel alphabet: the GPT-2 unicode stand-in of each byte -> the byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def special_names(num_base):
    return [K3_SPECIALS.get(i, "<|reserved_token_%d|>" % (num_base + i)) for i in range(NUM_SPECIAL)]


def train(texts, num_base):
    """Ranks {bytes: rank} with num_base entries, learned from the iterable of strings `texts`."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PAT_STR), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=num_base, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer)
    dec = _byte_decoder()
    ranks = {bytes([b]): r for r, b in enumerate(gpt2_byte_order())}
    merges = json.loads(tok.to_str())["model"]["merges"]
    for m in merges:
        a, b = m if isinstance(m, list) else m.split(" ")
        tb = bytes(dec[ch] for ch in a + b)
        if tb not in ranks:
            ranks[tb] = len(ranks)
        if len(ranks) == num_base:
            break
    return ranks, tok


def write(out_dir, ranks, model_max_length=1048576):
    os.makedirs(out_dir, exist_ok=True)
    num_base = len(ranks)
    with open(os.path.join(out_dir, "tiktoken.model"), "w") as f:
        for tb, r in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write("%s %d\n" % (base64.b64encode(tb).decode("ascii"), r))
    names = special_names(num_base)
    added = {}
    for i, name in enumerate(names):
        added[str(num_base + i)] = {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                                    "single_word": False, "special": True}
    cfg = {
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>", "[start_header_id]",
                                      "[end_header_id]", "[EOT]"],
        "bos_token": "[BOS]",
        "clean_up_tokenization_spaces": False,
        "eos_token": "[EOS]",
        "extra_special_tokens": {},
        "model_max_length": model_max_length,
        "pad_token": "[PAD]",
        "tokenizer_class": "TikTokenTokenizer",
        "unk_token": "[UNK]",
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


def load_ranks(path):
    ranks = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                b64, r = line.split()
                ranks[base64.b64decode(b64)] = int(r)
    return ranks


class Tok:
    """tiktoken over the files in a directory: ordinary encode, specials by name, decode."""

    def __init__(self, d):
        import tiktoken

        self.ranks = load_ranks(os.path.join(d, "tiktoken.model"))
        self.num_base = len(self.ranks)
        with open(os.path.join(d, "tokenizer_config.json")) as f:
            cfg = json.load(f)
        self.specials = {v["content"]: int(k) for k, v in cfg["added_tokens_decoder"].items()}
        self.vocab_size = self.num_base + NUM_SPECIAL
        self.enc = tiktoken.Encoding(name="k3-fortune", pat_str=PAT_STR, mergeable_ranks=self.ranks,
                                     special_tokens=self.specials)
        self.bos = self.num_base + BOS_OFFSET
        self.eos = self.num_base + EOS_OFFSET
        self.end_of_msg = self.num_base + END_OF_MSG_OFFSET
        self.pad = self.num_base + PAD_OFFSET

    def encode(self, text):
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts):
        return self.enc.encode_ordinary_batch(texts, num_threads=os.cpu_count() or 1)

    def special(self, name):
        return self.specials[name]

    def decode(self, ids):
        return self.enc.decode(ids)


def verify(tok_dir, hf_tok, texts):
    """Counts (documents equal, documents) of tiktoken's ids against the trainer's own encoding."""
    t = Tok(tok_dir)
    dec = _byte_decoder()
    vocab = {i: bytes(dec[ch] for ch in s) for s, i in hf_tok.get_vocab().items()}
    ours = t.encode_batch(texts)
    theirs = hf_tok.encode_batch(texts)
    equal = 0
    first_bad = None
    for s, a, b in zip(texts, ours, theirs):
        bt = [t.ranks.get(vocab[i], -1) for i in b.ids]
        if a == bt:
            equal += 1
        elif first_bad is None:
            first_bad = s[:80]
    return equal, len(texts), first_bad
