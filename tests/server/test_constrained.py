"""Constrained output through `k3c serve` and the `openai` client, on the embedded trained model (models/k3-fortune,
named with --model; loopback only; the server is started and stopped here). The model was trained on fortunes, never
on tools or JSON: without the constraint it does not call tools, so every call below is the grammar's doing.

  - a named tool_choice always gives one call of that function whose arguments json.loads as an object of its
    schema, greedy and sampled, streaming (the argument deltas joined) and not, thinking on and off, n > 1;
  - tool_choice "required" gives calls of the given tools only;
  - response_format json_object / json_schema: the content is one JSON object (of the schema);
  - refused with 400: a json_schema keyword k3c cannot enforce (naming it), an unknown response_format type,
    tool_choice naming a function that is not in tools; response_format text is accepted;
  - a constrained request beside unconstrained ones: the unconstrained outputs are those they get alone.

    python3 tests/server/test_constrained.py [--k3c build/k3c] [NAME ...]

Prints one line per test and "N passed, N failed"; exits 1 on a failure. Without the openai package the tests are
skipped with a note."""

import argparse
import concurrent.futures
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from serve_common import MODEL_NAME, ROOT, Server  # noqa: E402

try:
    import openai
except ImportError:
    openai = None

K3C = os.path.join(ROOT, "build", "k3c")
TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def client(srv):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=300)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "the city"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}, "utc": {"type": "boolean"}},
                   "required": ["zone"]}}}
NOOP = {"type": "function", "function": {"name": "noop"}}
TOOLS = [WEATHER, TIME, NOOP]
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def types_ok(v, schema):
    """The enforced keywords (type, properties, required, additionalProperties, items, enum), written from JSON
    Schema's meaning, independent of the server."""
    if "enum" in schema and v not in schema["enum"]:
        return False
    t = schema.get("type")
    if t is not None:
        ts = t if isinstance(t, list) else [t]
        py = {"string": str, "boolean": bool, "null": type(None), "object": dict, "array": list}

        def one(x):
            if x == "integer":
                return isinstance(v, int) and not isinstance(v, bool) or (isinstance(v, float) and v.is_integer())
            if x == "number":
                return isinstance(v, (int, float)) and not isinstance(v, bool)
            return isinstance(v, py[x])
        if not any(one(x) for x in ts):
            return False
    if isinstance(v, dict):
        props = schema.get("properties", {})
        if any(k not in v for k in schema.get("required", [])):
            return False
        for k, x in v.items():
            if k in props:
                if not types_ok(x, props[k]):
                    return False
            elif schema.get("additionalProperties") is False:
                return False
    if isinstance(v, list) and "items" in schema:
        return all(types_ok(x, schema["items"]) for x in v)
    return True


def tool_schema(name):
    for t in TOOLS:
        if t["function"]["name"] == name:
            return t["function"].get("parameters", {"type": "object"})
    return None


def check_call(name, args, want):
    check(name == want if want != "*" else tool_schema(name) is not None, "a call of %r (wanted %r)" % (name, want))
    v = json.loads(args)
    check(isinstance(v, dict), "arguments %r are not a JSON object" % args)
    check(types_ok(v, tool_schema(name)), "arguments %r do not satisfy %s's schema" % (args, name))


def check_message(msg, want):
    calls = msg.tool_calls or []
    check(calls, "no tool call: content %r" % (msg.content,))
    if want != "*":
        check(len(calls) == 1, "%d calls for a named function" % len(calls))
    for c in calls:
        check(c.type == "function" and c.id, c)
        check_call(c.function.name, c.function.arguments, want)


def stream_calls(stream):
    """The tool calls of a streamed choice, joined as the openai client's users join them: by index, the first
    delta naming the call, the rest carrying argument pieces. Returns (calls, finish_reason, content)."""
    calls, finish, content = {}, None, ""
    for ch in stream:
        for c in ch.choices:
            if c.delta.content:
                content += c.delta.content
            for tc in c.delta.tool_calls or []:
                e = calls.setdefault(tc.index, {"name": None, "args": "", "id": None})
                if tc.id:
                    e["id"] = tc.id
                if tc.function and tc.function.name:
                    e["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    e["args"] += tc.function.arguments
            if c.finish_reason:
                finish = c.finish_reason
    return [calls[i] for i in sorted(calls)], finish, content


@test
def named_tool_call(srv):
    c = client(srv)
    for thinking in (False, True):
        for temperature in (0, 0.9):
            kw = dict(model=MODEL_NAME, messages=MSGS, tools=TOOLS, tool_choice=NAMED, temperature=temperature,
                      max_tokens=300, seed=7, extra_body={"chat_template_kwargs": {"thinking": thinking}})
            r = c.chat.completions.create(**kw)
            check(r.choices[0].finish_reason == "tool_calls", r.choices[0])
            check_message(r.choices[0].message, "get_weather")
            check(not r.choices[0].message.content, "content beside the call: %r" % r.choices[0].message.content)
            calls, finish, content = stream_calls(c.chat.completions.create(stream=True, **kw))
            check(len(calls) == 1 and finish == "tool_calls" and not content, (calls, finish, content))
            check_call(calls[0]["name"], calls[0]["args"], "get_weather")
            # the same request, the same output (seeded), streamed or not
            check(calls[0]["args"] == r.choices[0].message.tool_calls[0].function.arguments,
                  "stream %r != %r" % (calls[0]["args"], r.choices[0].message.tool_calls[0].function.arguments))


@test
def named_tool_call_n_and_small_budget(srv):
    c = client(srv)
    r = c.chat.completions.create(model=MODEL_NAME, messages=MSGS, tools=TOOLS, tool_choice=NAMED, n=4,
                                  temperature=1.0, max_tokens=300)
    check(len(r.choices) == 4, r)
    for ch in r.choices:
        check_message(ch.message, "get_weather")
    # the shortest call this grammar allows, about: the budget makes the model close it in time
    r = c.chat.completions.create(model=MODEL_NAME, messages=MSGS, tools=[WEATHER], tool_choice=NAMED,
                                  temperature=0, max_tokens=140,
                                  extra_body={"chat_template_kwargs": {"thinking": False}})
    check(r.choices[0].finish_reason == "tool_calls", r.choices[0])
    check_message(r.choices[0].message, "get_weather")
    check(r.usage.completion_tokens <= 140, r.usage)


@test
def required_tool_calls(srv):
    c = client(srv)
    for parallel in (True, False):
        r = c.chat.completions.create(model=MODEL_NAME, messages=MSGS, tools=TOOLS, tool_choice="required",
                                      parallel_tool_calls=parallel, temperature=0.7, seed=3, max_tokens=300)
        check(r.choices[0].finish_reason == "tool_calls", r.choices[0])
        check_message(r.choices[0].message, "*")
        if not parallel:
            check(len(r.choices[0].message.tool_calls) == 1, r.choices[0].message)
        calls, finish, _ = stream_calls(c.chat.completions.create(
            model=MODEL_NAME, messages=MSGS, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel,
            temperature=0.7, seed=3, max_tokens=300, stream=True))
        check(calls and finish == "tool_calls", (calls, finish))
        for e in calls:
            check_call(e["name"], e["args"], "*")


@test
def json_object_content(srv):
    c = client(srv)
    for thinking in (False, True):
        for stream in (False, True):
            kw = dict(model=MODEL_NAME, messages=[{"role": "user", "content": "A fortune, as JSON"}],
                      response_format={"type": "json_object"}, temperature=0.8, seed=11, max_tokens=200,
                      extra_body={"chat_template_kwargs": {"thinking": thinking}})
            if stream:
                text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(stream=True, **kw)
                               if ch.choices)
            else:
                text = c.chat.completions.create(**kw).choices[0].message.content
            v = json.loads(text)
            check(isinstance(v, dict), "content %r is not a JSON object" % text)


@test
def json_schema_content(srv):
    c = client(srv)
    schema = {"type": "object", "properties": {"fortune": {"type": "string"}, "lucky": {"type": "integer"},
                                               "mood": {"enum": ["good", "bad"]}},
              "required": ["fortune", "lucky", "mood"], "additionalProperties": False}
    for temperature in (0, 1.0):
        r = c.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "A fortune"}], temperature=temperature,
            max_tokens=300, response_format={"type": "json_schema", "json_schema": {"name": "fortune", "strict": True,
                                                                                   "schema": schema}})
        v = json.loads(r.choices[0].message.content)
        check(types_ok(v, schema), "%r does not satisfy the schema" % v)
    r = c.chat.completions.create(model=MODEL_NAME, messages=MSGS, max_tokens=4, response_format={"type": "text"})
    check(r.choices[0].message.role == "assistant", r)


@test
def refusals(srv):
    c = client(srv)
    bad = [
        (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}}}}), "pattern"),
        (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "anyOf": [{"type": "object"}]}}}), "anyOf"),
        (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array"}}}),
         "root"),
        (dict(response_format={"type": "yaml"}), "yaml"),
        (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "nope"),
        (dict(tools=[WEATHER, WEATHER], tool_choice="required"), "twice"),
    ]
    for kw, needle in bad:
        try:
            c.chat.completions.create(model=MODEL_NAME, messages=MSGS, max_tokens=8, **kw)
        except openai.BadRequestError as e:
            msg = e.body.get("message", "") if isinstance(e.body, dict) else str(e.body)
            check(needle in msg, "400 for %s, but the message %r does not name %r" % (kw, msg, needle))
            continue
        raise AssertionError("no 400 for %s" % kw)


@test
def neighbours_unchanged(srv):
    """Unconstrained greedy requests give the same text beside constrained ones as alone."""
    c = client(srv)
    plain = [dict(model=MODEL_NAME, messages=[{"role": "user", "content": "Tell me a fortune %d" % i}], temperature=0,
                  max_tokens=40) for i in range(3)]
    alone = [c.chat.completions.create(**kw).choices[0].message.content for kw in plain]
    constrained = [dict(model=MODEL_NAME, messages=MSGS, tools=TOOLS, tool_choice=NAMED, temperature=0.8,
                        max_tokens=300),
                   dict(model=MODEL_NAME, messages=MSGS, response_format={"type": "json_object"}, temperature=0,
                        max_tokens=200)]
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        futs = [ex.submit(c.chat.completions.create, **kw) for kw in constrained + plain + constrained]
        out = [f.result() for f in futs]
    for i, r in enumerate(out[2:5]):
        check(r.choices[0].message.content == alone[i], "request %d beside constrained ones: %r != %r" % (
            i, r.choices[0].message.content, alone[i]))
    check_message(out[0].choices[0].message, "get_weather")
    check(isinstance(json.loads(out[1].choices[0].message.content), dict), out[1])


def main():
    global K3C
    ap = argparse.ArgumentParser()
    ap.add_argument("--k3c", default=K3C)
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    K3C = a.k3c
    if openai is None:
        print("note: the openai package is not installed: the constrained-output tests are skipped")
        print("0 passed, 0 failed, %d skipped" % len(TESTS))
        return
    passed = failed = 0
    srv = Server(k3c=K3C, args=["--max-seqs", "8", "--spec", "3"]).start()
    try:
        for fn in TESTS:
            if a.names and not any(n in fn.__name__ for n in a.names):
                continue
            t0 = time.time()
            try:
                fn(srv)
                passed += 1
                print("%-45s ok (%.2fs)" % (fn.__name__, time.time() - t0), flush=True)
            except Exception:
                failed += 1
                print("%-45s FAIL (%.2fs)\n%s" % (fn.__name__, time.time() - t0, traceback.format_exc()), flush=True)
            if srv.proc is None or srv.proc.poll() is not None:
                print("the server died:\n" + srv.log_text())
                failed += 1
                break
    finally:
        rc = srv.stop()
        if rc != 0:
            failed += 1
            print("server exit status %s:\n%s" % (rc, srv.log_text()))
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
