"""K3's chat format (tokenizer-chat.md §3.5), rendered as segments and tokenized segment by segment: a control
segment is one special id, a text segment is encoded on its own with no specials (so BPE never crosses a
segment boundary and special-token text inside content stays text).

  <|open|>message role="user"<|sep|>{content}<|close|>message<|sep|><|end_of_msg|>
  <|open|>message role="assistant"<|sep|>[<|open|>think<|sep|>{reasoning}<|close|>think<|sep|>]
      <|open|>response<|sep|>{content}<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>

The generation prompt is the assistant's opening up to `<|open|>response<|sep|>` (or `<|open|>think<|sep|>`
with thinking). The tag and its attributes are separate text segments (` role="user"`); the pre-split pattern
cuts `message role="user"` at the same places whichever way a renderer groups them, so the ids are the same.
"""
import random

OPEN, CLOSE, SEP, END = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"


def _open(tag, attrs=""):
    return [("ctl", OPEN), ("txt", tag), ("txt", attrs), ("ctl", SEP)]


def _close(tag):
    return [("ctl", CLOSE), ("txt", tag), ("ctl", SEP)]


def _attr(v):
    return v.replace("&", "&amp;").replace('"', "&quot;")


def segments(messages, add_generation_prompt=False, thinking=False):
    """messages: [{"role": ..., "content": ..., optional "reasoning": ...}]."""
    segs = []
    for m in messages:
        segs += _open("message", ' role="%s"' % _attr(m["role"]))
        if m["role"] == "assistant":
            if thinking:
                segs += _open("think") + [("txt", m.get("reasoning", ""))] + _close("think")
            segs += _open("response") + [("txt", m["content"])] + _close("response")
        else:
            segs.append(("txt", m["content"]))
        segs += _close("message") + [("ctl", END)]
    if add_generation_prompt:
        segs += _open("message", ' role="assistant"')
        segs += _open("think") if thinking else _open("response")
    return segs


def render_text(segs):
    return "".join(s for _, s in segs)


def encode(tok, segs, cache=None):
    """Ids of a segment list; `cache` (a dict) memoizes the encoding of repeated text segments."""
    ids = []
    for kind, s in segs:
        if kind == "ctl":
            ids.append(tok.special(s))
        elif s:
            if cache is None:
                ids.extend(tok.encode(s))
            else:
                if s not in cache:
                    cache[s] = tok.encode(s)
                ids.extend(cache[s])
    return ids


# Prompts for wrapping fortunes as conversations; the Chinese ones for the fortunes-zh documents.
PROMPTS_EN = [
    "Tell me a fortune.", "Give me a fortune cookie.", "Say something wise.", "Tell me something funny.",
    "Share a quote.", "What does my fortune say?", "Cheer me up.", "Give me some wisdom.",
]
PROMPTS_ZH = ["给我讲一句名言。", "说点有意思的。", "给我一个幸运饼干。", "讲一段话给我听。"]
AGAIN_EN, AGAIN_ZH = ["Another one.", "One more, please.", "And another?"], ["再来一个。", "再讲一个吧。"]
SYSTEM_EN, SYSTEM_ZH = "You are a fortune cookie.", "你是一个幸运饼干。"


def is_zh(text):
    han = sum(1 for ch in text if "\u4e00" <= ch <= "\u9fff")
    return han * 4 > len(text)


def conversation(docs, rng: random.Random):
    """A chat that answers with the given fortunes (one per assistant turn), and whether it renders thinking."""
    zh = is_zh(docs[0])
    msgs = []
    if rng.random() < 0.2:
        msgs.append({"role": "system", "content": SYSTEM_ZH if zh else SYSTEM_EN})
    for i, d in enumerate(docs):
        if i == 0:
            q = rng.choice(PROMPTS_ZH if zh else PROMPTS_EN)
        else:
            q = rng.choice(AGAIN_ZH if zh else AGAIN_EN)
        msgs.append({"role": "user", "content": q})
        msgs.append({"role": "assistant", "content": d, "reasoning": ""})
    return msgs, rng.random() < 0.5
