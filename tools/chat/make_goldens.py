#!/usr/bin/env python3
"""Renders the chat corpus (tests/fixtures/chat/conversations.json) through the published Kimi templates
(tests/fixtures/chat/*.jinja) with Python jinja2, the way transformers' apply_chat_template does, and writes
tests/fixtures/chat/goldens.json. The C test (tests/test_chat.c) renders each case natively and compares
byte for byte.

The jinja environment is transformers' (utils/chat_template_utils.py, _compile_jinja_template):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols extension and a
`generation` block tag, `tojson` replaced by json.dumps(x, ensure_ascii=False, indent=None, separators=None,
sort_keys=False) with those keywords exposed, and the globals raise_exception and strftime_now. The render call
passes messages, tools, documents=None, add_generation_prompt and the tokenizer's special tokens.

Before rendering, each family's caller-side steps (what runs before the template in the reference stacks):
  - K2 family: Kimi's tokenization_kimi.py apply_chat_template deep-sorts `tools` (dict keys in code point
    order, lists kept); an assistant `reasoning` is copied to `reasoning_content` when that is absent (vLLM's
    parse_chat_messages sets both names).
  - K3: the normalisation of Moonshot's encoding_k3.py: tool-call `arguments` given as a string are parsed
    (blank -> {}, a JSON object -> that object, not JSON -> kept as a `json` block via `_xtml_json_block`,
    JSON but not an object -> error), tools deep-sorted. The template itself re-sorts tool results.

llama.cpp's Kimi-K2-Instruct.jinja and Kimi-K2-Thinking.jinja keep their synthesized tool-call ids in a list
they append to and pop from; transformers' immutable sandbox refuses that (SecurityError), so a case that
raises it is rendered again in the mutable SandboxedEnvironment (same settings) and marked "env": "mutable".

    python3 tools/chat/make_goldens.py            # rewrites tests/fixtures/chat/goldens.json
    python3 tools/chat/make_goldens.py --check    # exit 1 when the committed goldens differ
"""
import argparse
import copy
import hashlib
import json
import os
import random
import struct
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "tests", "fixtures", "chat"))

# template file -> family (the caller-side normalisation it gets)
TEMPLATES = {
    "Kimi-K2-Instruct.jinja": "k2",
    "Kimi-K2-Thinking.jinja": "k2",
    "moonshotai-Kimi-K2-Thinking.jinja": "k2",
    "Kimi-K3.jinja": "k3",
}

# Kimi's tokenizer_config special tokens, passed to the template as transformers does (no template reads them)
SPECIAL_TOKENS = {"bos_token": "[BOS]", "eos_token": "[EOS]", "unk_token": "[UNK]", "pad_token": "[PAD]"}


class AssistantTracker(Extension):
    """transformers' {% generation %} block: renders its body (the assistant mask is not needed here)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def make_env(cls):
    env = cls(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def deep_sort(obj):
    if isinstance(obj, dict):
        return {k: deep_sort(v) for k, v in sorted(obj.items())}
    if isinstance(obj, list):
        return [deep_sort(v) for v in obj]
    return obj


def k3_arguments(fn):
    args = fn.get("arguments")
    fn.pop("_xtml_json_block", None)
    if args is None:
        fn["arguments"] = {}
    elif isinstance(args, str):
        if not args.strip():
            fn["arguments"] = {}
            return
        try:
            parsed = json.loads(args)
        except json.JSONDecodeError:
            fn["arguments"] = {}
            fn["_xtml_json_block"] = args
            return
        if not isinstance(parsed, dict):
            raise ValueError("Kimi K3 tool call arguments must be a JSON object.")
        fn["arguments"] = parsed


def prepare(conv, family):
    messages = copy.deepcopy(conv["messages"])
    tools = copy.deepcopy(conv.get("tools"))
    if tools is not None:
        tools = deep_sort(tools)
    for m in messages:
        if family == "k2":
            if m.get("role") == "assistant" and "reasoning" in m and "reasoning_content" not in m:
                m["reasoning_content"] = m["reasoning"]
        else:
            if m.get("tools") is not None:
                m["tools"] = deep_sort(m["tools"])
            for tc in m.get("tool_calls") or []:
                k3_arguments(tc["function"] if isinstance(tc.get("function"), dict) else tc)
    return messages, tools


def render(source, conv, family):
    try:
        messages, tools = prepare(conv, family)
    except ValueError as e:
        return {"error": str(e)}
    kwargs = dict(SPECIAL_TOKENS)
    kwargs.update(conv.get("kwargs", {}))
    for env_name, cls in (("hf", ImmutableSandboxedEnvironment), ("mutable", SandboxedEnvironment)):
        template = make_env(cls).from_string(source)
        try:
            text = template.render(messages=messages, tools=tools, documents=None,
                                   add_generation_prompt=conv["add_generation_prompt"], **kwargs)
        except jinja2.exceptions.SecurityError:
            continue
        except jinja2.exceptions.TemplateError as e:
            return {"error": str(e), "env": env_name}
        return {"text": text, "env": env_name}
    raise RuntimeError("unreachable")


def number_cases():
    """Doubles with Python's repr (what json.dumps writes for a float): edge values, random bit patterns and
    short decimals over the whole exponent range, from a fixed seed."""
    rng = random.Random(20261201)
    vals = [0.0, -0.0, 0.1, 1.5, 100.0, 1e16, 1e15, 1e-5, 1e-4, 5e-324, 2.2250738585072014e-308,
            1.7976931348623157e308, 9007199254740993.0, 123456789012345680.0, 1e22, 1e23, 0.3, 2.0 / 3.0]
    while len(vals) < 1000:
        bits = rng.getrandbits(64)
        v = struct.unpack("<d", struct.pack("<Q", bits))[0]
        if v == v and abs(v) != float("inf"):
            vals.append(v)
    for _ in range(1000):
        vals.append(float("%de%d" % (rng.randint(-99999, 99999), rng.randint(-330, 310))))
    return [{"bits": "%016x" % struct.unpack("<Q", struct.pack("<d", v))[0], "repr": json.dumps(v)} for v in vals]


def build():
    with open(os.path.join(FIXTURES, "conversations.json"), encoding="utf-8") as f:
        corpus = json.load(f)
    out = {"generator": "tools/chat/make_goldens.py", "jinja2": jinja2.__version__, "templates": {}, "cases": []}
    for name, family in TEMPLATES.items():
        with open(os.path.join(FIXTURES, name), "rb") as f:
            raw = f.read()
        out["templates"][name] = {"family": family, "sha256": hashlib.sha256(raw).hexdigest()}
        source = raw.decode("utf-8")
        for conv in corpus:
            if name in conv.get("skip_templates", []):
                continue
            case = {"template": name, "conversation": conv["name"]}
            case.update(render(source, conv, family))
            out["cases"].append(case)
    out["numbers"] = number_cases()
    return json.dumps(out, ensure_ascii=False, indent=1) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed goldens, write nothing")
    ap.add_argument("--out", default=os.path.join(FIXTURES, "goldens.json"))
    args = ap.parse_args()
    text = build()
    if args.check:
        with open(args.out, encoding="utf-8") as f:
            same = f.read() == text
        print("goldens up to date" if same else "goldens differ from %s" % args.out)
        return 0 if same else 1
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    data = json.loads(text)
    for name in TEMPLATES:
        cases = [c for c in data["cases"] if c["template"] == name]
        errors = sum("error" in c for c in cases)
        mutable = sum(c.get("env") == "mutable" for c in cases)
        print("%-36s %d cases (%d errors, %d rendered in the mutable sandbox)" % (name, len(cases), errors, mutable))
    return 0


if __name__ == "__main__":
    sys.exit(main())
