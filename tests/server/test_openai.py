"""`k3c serve` against the `openai` Python client and raw HTTP, on the embedded default model (its files in
models/k3-fortune, named with --model; loopback only; every server is started and stopped here). Greedy outputs are compared with `k3c generate` on the
same prompt ids, alone, in a full batch, after preemptions and with a prefix-cache hit.

    python3 tests/server/test_openai.py [--k3c build/k3c] [NAME ...]

Prints one line per test and "N passed, N failed"; exits 1 on a failure. Without the openai package the
tests that use it are skipped with a note (the raw-HTTP ones still run)."""

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import threading
import tempfile
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from serve_common import MODEL_DIR, MODEL_NAME, ROOT, Server, finish_reason, joined_text, stream, wait_for  # noqa: E402

try:
    import openai
except ImportError:
    openai = None

K3C = os.path.join(ROOT, "build", "k3c")
TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


def needs_openai(fn):
    fn.needs_openai = True
    return fn


def generate_ids(prompt, n):
    out = subprocess.run([K3C, "generate", "--model", MODEL_DIR, "--prompt-ids", ",".join(map(str, prompt)), "-n", str(n),
                          "--ignore-eos"],
                         capture_output=True, text=True, check=True).stdout
    return [int(x) for x in out.split()]


def detokenize(ids):
    out = subprocess.run([K3C, "detokenize", "--model", MODEL_DIR, "--ids", ",".join(map(str, ids))], capture_output=True,
                         check=True).stdout
    return out.decode("utf-8")[:-1]


def reference_text(prompt, n):
    return detokenize(generate_ids(prompt, n))


def random_prompt(rng, n):
    return [rng.randrange(1, 700) for _ in range(n)]


def greedy_body(prompt, n, **kw):
    b = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "skip_special_tokens": False}
    b.update(kw)
    return b


def client(srv, **kw):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, timeout=120, **kw)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


# ---- endpoints ----

@test
def health_models_version(srv):
    st, body = srv.request("GET", "/health")
    check(st == 200 and body == {"status": "ok"}, "health: %s %s" % (st, body))
    st, body = srv.request("GET", "/v1/models")
    check(st == 200 and body["data"][0]["id"] == MODEL_NAME and body["data"][0]["max_model_len"] == 4096, body)
    st, body = srv.request("GET", "/version")
    check(st == 200 and "version" in body, body)
    st, body = srv.request("GET", "/nope")
    check(st == 404 and "error" in body, body)
    st, body = srv.request("GET", "/v1/completions")
    check(st == 405 and "error" in body, body)


@test
def tokenize_round_trip(srv):
    text = "Hello, k3c! \u4f60\u597d \U0001F600"
    st, t = srv.request("POST", "/tokenize", {"prompt": text})
    check(st == 200 and t["count"] == len(t["tokens"]) and t["max_model_len"] == 4096, t)
    st, d = srv.request("POST", "/detokenize", {"tokens": t["tokens"]})
    check(st == 200 and d["prompt"] == text, d)
    st, c = srv.request("POST", "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    check(st == 200 and c["count"] > 3, c)
    st, e = srv.request("POST", "/detokenize", {"tokens": [10 ** 6]})
    check(st == 400 and e["error"]["param"] == "tokens", e)


# ---- greedy equality with k3c generate ----

@test
def completions_equal_generate(srv):
    rng = random.Random(1)
    for i in range(4):
        prompt = random_prompt(rng, rng.randrange(1, 40))
        n = rng.randrange(1, 48)
        want = reference_text(prompt, n)
        st, body = srv.request("POST", "/v1/completions", greedy_body(prompt, n))
        check(st == 200, body)
        got = body["choices"][0]["text"]
        check(got == want, "prompt %s: %r != %r" % (prompt, got, want))
        check(body["usage"]["completion_tokens"] == n and body["usage"]["prompt_tokens"] == len(prompt), body["usage"])
        check(body["choices"][0]["finish_reason"] == "length", body)


@test
@needs_openai
def openai_completions_stream_equal_generate(srv):
    c = client(srv)
    prompt = [5, 17, 300, 42]
    want = reference_text(prompt, 40)
    extra = {"ignore_eos": True, "skip_special_tokens": False}
    got = c.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=40, temperature=0, extra_body=extra)
    check(got.choices[0].text == want, "non-streaming %r != %r" % (got.choices[0].text, want))
    parts, usage, finish = [], None, None
    for ch in c.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=40, temperature=0, stream=True,
                                   stream_options={"include_usage": True}, extra_body=extra):
        if ch.choices:
            parts.append(ch.choices[0].text)
            finish = ch.choices[0].finish_reason or finish
        if ch.usage:
            usage = ch.usage
    check("".join(parts) == want, "streamed %r != %r" % ("".join(parts), want))
    check(finish == "length" and usage.completion_tokens == 40 and usage.prompt_tokens == 4, (finish, usage))
    check(usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens >= 0, usage)


@test
def batch_invariance(srv):
    """The same prompts alone, then all at once (a full batch): the same greedy text."""
    rng = random.Random(2)
    prompts = [random_prompt(rng, rng.randrange(2, 60)) for _ in range(12)]
    n = 24
    solo = [srv.request("POST", "/v1/completions", greedy_body(p, n))[1]["choices"][0]["text"] for p in prompts]
    for i in range(3):
        check(solo[i] == reference_text(prompts[i], n), "solo %d differs from k3c generate" % i)

    async def all_at_once():
        return await asyncio.gather(*[stream(srv.port, "/v1/completions", greedy_body(p, n, stream=True)) for p in prompts])

    for k, (st, ev, done, _) in enumerate(asyncio.run(all_at_once())):
        check(st == 200 and done, "stream %d: %s" % (k, st))
        check(joined_text(ev) == solo[k], "prompt %d: batched %r != solo %r" % (k, joined_text(ev), solo[k]))


@test
def prefix_hit_same_output(srv):
    """A 256-token system prompt (two prefix grids of the engine's default blocks) before two user turns: the
    second request and a repeat of the first skip the system prompt (cached_tokens 256, the prefix grid's
    multiple below the prompt's last whole grid block) and give the text they give alone."""
    rng = random.Random(3)
    system = random_prompt(rng, 256)
    a, b = system + random_prompt(rng, 5), system + random_prompt(rng, 9)
    n = 16
    hits0 = srv.metrics()["k3c:prefix_cache_hits_total"]
    computed = []
    for p in (a, b, a):
        before = srv.metrics()["k3c:prompt_tokens_computed_total"]
        computed.append((srv.request("POST", "/v1/completions", greedy_body(p, n))[1],
                         srv.metrics()["k3c:prompt_tokens_computed_total"] - before))
    (first, c0), (other, c1), (second, c2) = computed
    # the system prompt costs no prefill the second time: only the tokens after it are computed
    check((c0, c1, c2) == (len(a), len(b) - 256, len(a) - 256), "prompt tokens computed %s" % ((c0, c1, c2),))
    check(first["choices"][0]["text"] == second["choices"][0]["text"], "repeat differs")
    check(first["choices"][0]["text"] == reference_text(a, n), "differs from k3c generate")
    check(other["choices"][0]["text"] == reference_text(b, n), "the other turn differs from k3c generate")
    cached = [x["usage"]["prompt_tokens_details"]["cached_tokens"] for x in (first, other, second)]
    hits = srv.metrics()["k3c:prefix_cache_hits_total"] - hits0
    check(cached == [0, 256, 256] and hits == 512, "cached_tokens %s, hits %s" % (cached, hits))


# ---- chat ----

@test
@needs_openai
def openai_chat(srv):
    c = client(srv)
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]
    r = c.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=12, temperature=0)
    m = r.choices[0].message
    check(m.role == "assistant" and r.choices[0].finish_reason in ("stop", "length"), r)
    check(r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 5, r.usage)
    # streaming: role chunk first, same id throughout, the same text as non-streaming, usage last
    chunks = list(c.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    check(chunks[0].choices[0].delta.role == "assistant", chunks[0])
    check(len({ch.id for ch in chunks}) == 1, "ids differ")
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    reasoning = "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or "" for ch in chunks if ch.choices)
    check(content == (m.content or ""), "content %r != %r" % (content, m.content))
    check(reasoning == (getattr(m, "reasoning_content", None) or ""), "reasoning differs")
    check(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens, chunks[-1])


@test
@needs_openai
def openai_chat_n_logprobs(srv):
    c = client(srv)
    msgs = [{"role": "user", "content": "Count."}]
    r = c.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=8, temperature=0.9, seed=7, n=3,
                                  logprobs=True, top_logprobs=3)
    check(len(r.choices) == 3 and sorted(ch.index for ch in r.choices) == [0, 1, 2], r.choices)
    for ch in r.choices:
        lp = ch.logprobs.content
        # a stop token ends the output without being part of it (nor of the logprobs)
        check(len(lp) >= 1 or ch.finish_reason == "stop", ch)
        for e in lp:
            check(e.logprob <= 0 and len(e.top_logprobs) == 3, e)
            tops = [t.logprob for t in e.top_logprobs]
            check(tops == sorted(tops, reverse=True), "top_logprobs not sorted: %s" % tops)
            check(e.logprob <= tops[0] + 1e-5, "chosen above the best")
    again = c.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=8, temperature=0.9, seed=7, n=3)
    check([x.message.content for x in again.choices] == [x.message.content for x in r.choices], "seeded n not repeatable")


@test
@needs_openai
def openai_completions_logprobs_n(srv):
    c = client(srv)
    r = c.completions.create(model=MODEL_NAME, prompt=[[1, 2, 3], [4, 5]], max_tokens=6, temperature=0, n=2, logprobs=2,
                             extra_body={"ignore_eos": True})
    check(len(r.choices) == 4, r)
    for ch in r.choices:
        lp = ch.logprobs
        check(len(lp.tokens) == 6 and len(lp.token_logprobs) == 6 and len(lp.top_logprobs) == 6, r)
        check(all(len(t) <= 2 for t in lp.top_logprobs), lp.top_logprobs)
    # greedy: both samples of a prompt are the same text
    check(r.choices[0].text == r.choices[1].text and r.choices[2].text == r.choices[3].text, [x.text for x in r.choices])


@test
def n_choices_all_complete(srv):
    """n choices of a short greedy request: the first may finish before the last is submitted, and every
    choice must still get its tokens (the response waits for all of them)."""
    for k in range(40):
        st, body = srv.request("POST", "/v1/completions", dict(greedy_body([k + 1, 2], 1 + k % 3), n=8))
        check(st == 200 and len(body["choices"]) == 8, (st, body))
        texts = {c["text"] for c in body["choices"]}
        check(len(texts) == 1 and body["usage"]["completion_tokens"] == 8 * (1 + k % 3), body)


@test
@needs_openai
def openai_stop_strings(srv):
    c = client(srv)
    prompt = [9, 8, 7, 6]
    full = reference_text(prompt, 60)
    # a stop string from the middle of the greedy text: the output is what precedes its first occurrence
    chars = [ch for ch in full[10:40] if ch.strip() and ch != "\ufffd"]
    check(chars, "no usable text in %r" % full)
    stop = chars[len(chars) // 2]
    want = full[:full.index(stop)]
    extra = {"ignore_eos": True, "skip_special_tokens": False}
    r = c.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=60, temperature=0, stop=[stop], extra_body=extra)
    check(r.choices[0].text == want and r.choices[0].finish_reason == "stop", (r.choices[0].text, want, stop))
    parts = [ch.choices[0].text for ch in c.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=60,
                                                               temperature=0, stop=[stop], stream=True, extra_body=extra)]
    check("".join(parts) == want, "streamed %r != %r" % ("".join(parts), want))
    r = c.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=60, temperature=0, stop=[stop],
                             extra_body=dict(extra, include_stop_str_in_output=True))
    check(r.choices[0].text == want + stop, r.choices[0].text)


@test
@needs_openai
def openai_tools(srv):
    c = client(srv)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    for choice in ("auto", "none", "required", {"type": "function", "function": {"name": "get_weather"}}):
        r = c.chat.completions.create(model=MODEL_NAME, messages=msgs, tools=tools, tool_choice=choice, max_tokens=16,
                                      temperature=0)
        check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), r)
        s = list(c.chat.completions.create(model=MODEL_NAME, messages=msgs, tools=tools, tool_choice=choice, max_tokens=16,
                                           temperature=0, stream=True))
        content = "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices)
        check(content == (r.choices[0].message.content or ""), "tool_choice %s: stream differs" % (choice,))
    # a tool result in the history renders
    msgs2 = msgs + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    r = c.chat.completions.create(model=MODEL_NAME, messages=msgs2, tools=tools, max_tokens=4, temperature=0)
    check(r.choices[0].message.role == "assistant", r)


# ---- bad input ----

@test
@needs_openai
def openai_errors(srv):
    c = client(srv)
    msgs = [{"role": "user", "content": "x"}]
    cases = [
        (openai.NotFoundError, dict(model="nope", messages=msgs)),
        (openai.BadRequestError, dict(model=MODEL_NAME, messages=msgs, temperature=-1)),
        (openai.BadRequestError, dict(model=MODEL_NAME, messages=msgs, max_tokens=5000)),
        (openai.BadRequestError, dict(model=MODEL_NAME, messages=msgs, extra_body={"frobnicate": 1})),
        (openai.BadRequestError, dict(model=MODEL_NAME, messages=[{"role": "user", "content": "x " * 6000}])),
        (openai.BadRequestError, dict(model=MODEL_NAME, messages=[])),
    ]
    for exc, kw in cases:
        try:
            c.chat.completions.create(**kw)
        except exc as e:
            body = e.body if isinstance(e.body, dict) else {}
            check("message" in body and "type" in body and "param" in body and "code" in body,
                  "error shape %s" % (e.body,))
            continue
        raise AssertionError("no %s for %s" % (exc.__name__, kw))


@test
def raw_errors(srv):
    for raw in (b"{", b"[1,2]", b"\xff\xfe", b'{"prompt": "x", "max_tokens": "9"}', b'{"prompt": "x"}\x00', b""):
        st, body = srv.request("POST", "/v1/completions", raw=raw)
        check(st == 400 and set(body["error"]) == {"message", "type", "param", "code"}, (raw, st, body))
    # past the context: 400 with context_length_exceeded
    st, body = srv.request("POST", "/v1/completions", {"prompt": [1] * 4096, "max_tokens": 1})
    check(st == 400 and body["error"]["code"] == "context_length_exceeded", body)
    st, body = srv.request("POST", "/v1/completions", {"prompt": [1] * 10, "max_tokens": 4090})
    check(st == 400 and body["error"]["code"] == "context_length_exceeded", body)
    st, body = srv.request("POST", "/v1/completions", {"prompt": [1, 10 ** 7], "max_tokens": 1})
    check(st == 400 and body["error"]["param"] == "prompt", body)
    # a body past --max-body: 413 from its Content-Length, before the body is sent
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n")
    head = s.recv(4096)
    s.close()
    check(head.startswith(b"HTTP/1.1 413"), head[:40])
    # and chunked, without a length: refused once it passes the limit (413, or the connection closed)
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    got = b""
    try:
        for _ in range(64):
            s.sendall(b"10000\r\n" + b" " * 65536 + b"\r\n")
            s.settimeout(0.01)
            try:
                got += s.recv(4096)
            except socket.timeout:
                pass
            if got:
                break
    except (BrokenPipeError, ConnectionResetError):
        pass
    s.close()
    check(got.startswith(b"HTTP/1.1 413") or got == b"", got[:40])
    check(srv.request("GET", "/health")[0] == 200, "server gone after bad input")


# ---- servers of their own ----

@test
def scheduling_policy(srv_unused):
    """A request's priority needs --scheduling-policy priority (FCFS refuses it, as vLLM does)."""
    st, body = srv_unused.request("POST", "/v1/completions", dict(greedy_body([1, 2], 2), priority=3))
    check(st == 400 and "priority" in body["error"]["message"], (st, body))
    with Server(args=["--scheduling-policy", "priority"]) as s:
        st, body = s.request("POST", "/v1/completions", dict(greedy_body([1, 2], 2), priority=3))
        check(st == 200 and body["usage"]["completion_tokens"] == 2, (st, body))


@test
def snapshot_retention_and_cap(srv_unused):
    """KDA snapshots of the prefix cache: a 600-token prompt prefilled in chunks of 128 (the prefix grid)
    keeps one at every grid boundary its chunks end on below its last whole grid block (128 .. 512), every
    second one with --snapshot-interval 2 (and always the last, 512), and at most what --snapshot-memory
    holds (the oldest evicted)."""
    prompt = random_prompt(random.Random(7), 600)

    def snapshots(args):
        with Server(args=["--max-batched-tokens", "128"] + args) as s:
            st, body = s.request("POST", "/v1/completions", greedy_body(prompt, 1))
            check(st == 200, body)
            m = s.metrics()
            return int(m["k3c:kda_snapshots"]), int(m["k3c:kda_snapshot_bytes"])
    n1, b1 = snapshots([])
    check(n1 == 4 and b1 % 4 == 0, "interval 1: %d snapshots" % n1)
    n2, _ = snapshots(["--snapshot-interval", "2"])
    check(n2 == 2, "interval 2: %d snapshots" % n2)
    n3, b3 = snapshots(["--snapshot-memory", str(2 * b1 // 4)])
    check(n3 == 2 and b3 == 2 * b1 // 4, "a cap of two: %d snapshots, %d bytes" % (n3, b3))

@test
def api_key(srv_unused):
    with Server(args=["--api-key", "sekrit"]) as s:
        st, body = s.request("GET", "/v1/models")
        check(st == 401 and body["error"]["code"] == "invalid_api_key", body)
        st, body = s.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
        check(st == 401, body)
        st, body = s.request("GET", "/v1/models", headers={"Authorization": "Bearer sekrit"})
        check(st == 200, body)
        check(s.request("GET", "/health")[0] == 200, "health needs no key")
        if openai:
            try:
                client(s, api_key="bad").models.list()
                raise AssertionError("no 401")
            except openai.AuthenticationError:
                pass
            check(client(s, api_key="sekrit").models.list().data[0].id == MODEL_NAME, "models with the key")


@test
def queue_full_429(srv_unused):
    with Server(args=["--max-seqs", "1", "--max-queue", "1"]) as s:
        async def run():
            first = asyncio.Event()
            a = asyncio.ensure_future(stream(s.port, "/v1/completions", greedy_body([1, 2], 3000, stream=True),
                                             on_event=lambda e: first.set()))
            await asyncio.wait_for(first.wait(), 30)
            b = asyncio.ensure_future(stream(s.port, "/v1/completions", greedy_body([3, 4], 3000, stream=True)))
            await asyncio.sleep(0.3)
            m = s.metrics()
            check(m["k3c:num_requests_running"] == 1 and m["k3c:num_requests_waiting"] == 1, m)
            st, body = await asyncio.get_event_loop().run_in_executor(
                None, lambda: s.request("POST", "/v1/completions", greedy_body([5], 4)))
            check(st == 429 and body["error"]["code"] == "queue_full", (st, body))
            a.cancel()
            b.cancel()
            await asyncio.gather(a, b, return_exceptions=True)
        asyncio.run(run())
        check(wait_for(lambda: s.metrics()["k3c:num_requests_running"] == 0 and
                       s.metrics()["k3c:num_requests_waiting"] == 0, 3), "requests left after the clients went")
        check(s.metrics()['k3c:request_rejected_total{reason="queue_full"}'] == 1, "rejection not counted")


@test
def disconnect_aborts(srv_unused):
    """A client that leaves while decoding, while waiting in the queue, while its prompt is prefilled, or
    during a non-streaming request: its request is aborted and its blocks freed within a second."""
    with Server(args=["--max-seqs", "1"]) as s:
        async def run():
            # decoding: cut after 3 events
            t0 = time.monotonic()
            st, ev, done, _ = await stream(s.port, "/v1/completions", greedy_body([1, 2, 3], 4000, stream=True), cut_after=3)
            check(st == 200 and not done, "stream did not start")
            gone = await asyncio.get_event_loop().run_in_executor(
                None, lambda: wait_for(lambda: s.metrics()["k3c:num_requests_running"] == 0, 1.0))
            check(gone, "decoding request still running 1 s after its client left")
            # waiting: a long one runs, a second waits; the second's client leaves
            first = asyncio.Event()
            a = asyncio.ensure_future(stream(s.port, "/v1/completions", greedy_body([1, 2], 4000, stream=True),
                                             on_event=lambda e: first.set()))
            await asyncio.wait_for(first.wait(), 30)
            b = asyncio.ensure_future(stream(s.port, "/v1/completions", greedy_body([7, 7], 4000, stream=True)))
            await asyncio.sleep(0.3)
            check(s.metrics()["k3c:num_requests_waiting"] == 1, "second request not waiting")
            b.cancel()
            await asyncio.gather(b, return_exceptions=True)
            gone = await asyncio.get_event_loop().run_in_executor(
                None, lambda: wait_for(lambda: s.metrics()["k3c:num_requests_waiting"] == 0, 1.0))
            check(gone, "waiting request still queued 1 s after its client left")
            a.cancel()
            await asyncio.gather(a, return_exceptions=True)
            return t0
        asyncio.run(run())
        check(wait_for(lambda: s.metrics()["k3c:num_requests_running"] == 0, 1.0), "still running")
        gen0 = s.metrics()["k3c:generation_tokens_total"]
        # prefilling: a 3000-token prompt (seconds of prefill on the CPU), streamed; the client leaves before
        # the first token
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        body = json.dumps(greedy_body(random_prompt(random.Random(11), 3000), 4, stream=True)).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        check(wait_for(lambda: s.metrics()["k3c:num_requests_running"] == 1, 5), "long prompt not running")
        time.sleep(0.3)
        check(s.metrics()["k3c:generation_tokens_total"] == gen0, "the long prompt already produced a token")
        sock.close()
        check(wait_for(lambda: s.metrics()["k3c:num_requests_running"] == 0, 1.0),
              "prefilling request still running 1 s after its client left")
        # non-streaming: the client closes while the request runs
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        body = json.dumps(greedy_body([4, 4], 4000)).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        check(wait_for(lambda: s.metrics()["k3c:num_requests_running"] == 1, 5), "non-streaming request not running")
        sock.close()
        check(wait_for(lambda: s.metrics()["k3c:num_requests_running"] == 0, 1.0),
              "non-streaming request still running 1 s after its client left")
        m = s.metrics()
        check(m["k3c:kv_cache_blocks_used"] == 0 and m['k3c:request_success_total{finished_reason="abort"}'] >= 4, m)


def preempted_streams(args, prompts, n):
    """Each prompt alone, then all at once on a cache too small for them: (solo texts, flood results,
    preemptions counted, metrics after)."""
    with Server(args=args) as s:
        solo = [s.request("POST", "/v1/completions", greedy_body(p, n))[1]["choices"][0]["text"] for p in prompts]

        async def run():
            return await asyncio.gather(*[stream(s.port, "/v1/completions", greedy_body(p, n, stream=True)) for p in prompts])
        before = s.metrics()["k3c:num_preemptions_total"]
        res = asyncio.run(run())
        m = s.metrics()
        return solo, res, m["k3c:num_preemptions_total"] - before, m


@test
def preemption_same_output(srv_unused):
    """A cache too small for every running request: the scheduler preempts (recompute), and every output is
    the one the request gave alone, with the release (bf16) arithmetic: the scheduler replays a preempted
    request's generated tokens in the forms decoding gave them (batch invariance). With and without prefix
    caching (with it, a resumed request may start from its own cached blocks)."""
    rng = random.Random(5)
    head = random_prompt(rng, 128)
    prompts = [random_prompt(rng, 40) for _ in range(6)] + [head + random_prompt(rng, 20 + k) for k in range(2)]
    n = 40
    for caching in (False, True):
        args = ["--max-seqs", "8", "--kv-blocks", "24"] + ([] if caching else ["--no-prefix-caching"])
        solo, res, preempted, m = preempted_streams(args, prompts, n)
        check(preempted > 0, "prefix caching %s: no preemption happened" % caching)
        check(m["k3c:num_requests_running"] == 0 and m["k3c:kv_cache_blocks_used"] == 0, m)
        differ = []
        for k, (st, ev, done, _) in enumerate(res):
            check(st == 200 and done, "stream %d: %s %s" % (k, st, ev[-1:] if ev else ""))
            if joined_text(ev) != solo[k]:
                differ.append(k)
        check(not differ, "prefix caching %s: prompts %s differ from their solo output after %d preemptions" % (
            caching, differ, preempted))


@test
def parallel_layouts_same_output(srv):
    """`k3c serve --pp 2` (two pipeline stages) and `--dp 2 --ep` (DP attention + EP MoE: each request on one DP
    rank, the experts spread over both) answer several requests at once, of different lengths, some sharing a
    cached prefix, on a cache small enough to preempt: every output is the shared world-size-1 server's for
    that prompt alone (both layouts are bitwise world size 1, docs/PARALLEL.md)."""
    rng = random.Random(26)
    head = random_prompt(rng, 128)  # the prefix grid: hits sit on multiples of 128 tokens
    prompts = [random_prompt(rng, 5 + 9 * k) for k in range(4)] + [head + random_prompt(rng, 3 + k) for k in range(3)]
    n = 40
    solo = [srv.request("POST", "/v1/completions", greedy_body(p, n))[1]["choices"][0]["text"] for p in prompts]
    for layout in (["--pp", "2"], ["--dp", "2", "--ep"]):
        with Server(args=layout + ["--max-seqs", "8", "--kv-blocks", "16"]) as s:
            async def run():
                return await asyncio.gather(*[stream(s.port, "/v1/completions", greedy_body(p, n, stream=True))
                                              for p in prompts])
            res = asyncio.run(run())
            again = s.request("POST", "/v1/completions", greedy_body(prompts[-1], n))  # a prefix hit
            m = s.metrics()
        for k, (st, ev, done, _) in enumerate(res):
            check(st == 200 and done, "%s stream %d: %s %s" % (layout, k, st, ev[-1:] if ev else ""))
            check(joined_text(ev) == solo[k], "%s: prompt %d: %r, world size 1 %r" % (layout, k, joined_text(ev), solo[k]))
        check(again[0] == 200 and again[1]["choices"][0]["text"] == solo[-1], (layout, again))
        check(m["k3c:num_requests_running"] == 0, (layout, m))
        check(m["k3c:num_preemptions_total"] > 0 and m["k3c:prefix_cache_hits_total"] > 0,
              "%s: preemptions %d, prefix hits %d tokens" % (layout, m["k3c:num_preemptions_total"],
                                                           m["k3c:prefix_cache_hits_total"]))


@test
def default_model_served(srv):
    """No --model and no --preset: the embedded model, served as k3-fortune, its greedy completion the same as
    from its files in the tree; the temporary directory it was written to is gone after SIGTERM."""
    tmp = tempfile.mkdtemp(prefix="k3c-serve-default-")
    s = Server(env={"TMPDIR": tmp})
    s.args = []
    s.start()
    try:
        st, models = s.request("GET", "/v1/models")
        check(st == 200 and [m["id"] for m in models["data"]] == ["k3-fortune"], "models %s %s" % (st, models))
        body = greedy_body([1, 2, 3], 12)
        st_a, a = s.request("POST", "/v1/completions", body)
        st_b, b = srv.request("POST", "/v1/completions", dict(body, model=MODEL_NAME))
        check(st_a == 200 and st_b == 200, "status %s %s" % (st_a, st_b))
        check(a["choices"][0]["text"] == b["choices"][0]["text"],
              "embedded %r vs files %r" % (a["choices"][0]["text"], b["choices"][0]["text"]))
    finally:
        rc = s.stop(timeout=30)
    left = os.listdir(tmp)
    os.rmdir(tmp) if not left else None
    check(rc == 0, "exit status %s:\n%s" % (rc, s.log_text()))
    check(not left, "left in TMPDIR: %s" % left)


@test
def sigterm_drains(srv_unused):
    s = Server(args=["--grace", "5"]).start()

    async def run():
        first = asyncio.Event()
        t = asyncio.ensure_future(stream(s.port, "/v1/completions", greedy_body([1, 2], 200, stream=True),
                                         on_event=lambda e: first.set()))
        await asyncio.wait_for(first.wait(), 30)
        s.proc.send_signal(15)
        return await t
    st, ev, done, _ = asyncio.run(run())
    rc = s.stop(timeout=30)
    check(rc == 0, "exit status %s:\n%s" % (rc, s.log_text()))
    check(done and finish_reason(ev) == "length", "running stream not finished during the grace period")


@test
def sigterm_aborts_after_grace(srv_unused):
    s = Server(args=["--grace", "0.5"]).start()

    async def run():
        first = asyncio.Event()
        t = asyncio.ensure_future(stream(s.port, "/v1/completions", greedy_body([1, 2], 4000, stream=True),
                                         on_event=lambda e: first.set()))
        await asyncio.wait_for(first.wait(), 30)
        t0 = time.monotonic()
        s.proc.send_signal(15)
        r = await t
        return r, time.monotonic() - t0
    (st, ev, done, _), took = asyncio.run(run())
    rc = s.stop(timeout=30)
    check(rc == 0, "exit status %s" % rc)
    check(took < 4, "stream ended %.1f s after SIGTERM" % took)
    check(any("error" in e for e in ev) and done, "aborted stream has no error event")


def main():
    global K3C
    ap = argparse.ArgumentParser()
    ap.add_argument("--k3c", default=K3C)
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    K3C = a.k3c
    if openai is None:
        print("note: the openai package is not installed: the openai-client tests are skipped")
    passed = failed = skipped = 0
    srv = Server(k3c=K3C).start()
    try:
        for fn in TESTS:
            if a.names and not any(n in fn.__name__ for n in a.names):
                continue
            if getattr(fn, "needs_openai", False) and openai is None:
                skipped += 1
                print("%-45s skipped (no openai package)" % fn.__name__)
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
                print("the shared server died:\n" + srv.log_text())
                failed += 1
                break
    finally:
        rc = srv.stop()
        if rc != 0:
            failed += 1
            print("shared server exit status %s:\n%s" % (rc, srv.log_text()))
    print("%d passed, %d failed%s" % (passed, failed, ", %d skipped" % skipped if skipped else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
