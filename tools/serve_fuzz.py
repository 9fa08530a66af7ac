#!/usr/bin/env python3
"""A bounded random-request run against a live `k3c serve` (meant for an ASan + UBSan build: `make
serve-asan-test`). Each request is a valid OpenAI body mutated at random (fields dropped, retyped, set to
extreme values, unknown fields added, the JSON text cut or flipped), sent whole, chunked or cut off, to a
random endpoint; some are streams read partly. The server must answer every complete request with a status
and, for 4xx/5xx, an OpenAI-shaped error, and stay up; a sanitizer report or a crash ends it, which the run
sees as a dead server. Standard library only.

    python3 tools/serve_fuzz.py [--k3c build-asan/k3c] [--requests 400] [--seed S]"""

import argparse
import json
import os
import random
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_common import ROOT, Server  # noqa: E402

PATHS = ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize", "/v1/models", "/health", "/metrics",
         "/v1/nope"]
WEIRD = [None, True, False, 0, -1, 1, 2 ** 31, 2 ** 63, -2 ** 63, 1e308, -1e308, 0.5, "", "x", "\u0000", "\ufffd",
         [], {}, [1, 2], {"a": 1}, "a" * 5000, [[]], [None], [{"role": "user"}], 1e-320]


def base_body(rng, path):
    msgs = [{"role": rng.choice(["system", "user", "assistant", "tool", "bogus"]), "content": rng.choice(
        ["hi", "", None, [{"type": "text", "text": "x"}], [{"type": "image_url", "image_url": {"url": "x"}}], 5])}
        for _ in range(rng.randrange(0, 4))]
    b = {"model": rng.choice(["tiny", None, "other"]), "max_tokens": rng.randrange(1, 24),
         "temperature": rng.choice([0, 0.7, 1.5]), "stream": rng.random() < 0.4}
    if path == "/v1/chat/completions":
        b["messages"] = msgs or [{"role": "user", "content": "hello"}]
        if rng.random() < 0.3:
            b["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
            b["tool_choice"] = rng.choice(["auto", "none", "required", {"type": "function", "function": {"name": "f"}}])
        if rng.random() < 0.3:
            b["logprobs"] = True
            b["top_logprobs"] = rng.randrange(0, 6)
        if rng.random() < 0.2:  # constrained output (the grammar), schemas k3c enforces or refuses
            b["response_format"] = rng.choice([
                {"type": "json_object"}, {"type": "text"},
                {"type": "json_schema", "json_schema": {"name": "s", "schema": {
                    "type": "object", "properties": {"a": {"type": rng.choice(["string", "integer", "array"])},
                                                     "b": {"enum": [1, "x", None]}},
                    "required": rng.choice([["a"], ["a", "b"], []]),
                    "additionalProperties": rng.choice([True, False])}}},
                {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object", "properties": {
                    "p": {"type": "string", "pattern": "x"}}}}}])
    elif path == "/v1/completions":
        b["prompt"] = rng.choice(["hello world", [1, 2, 3], [[1, 2], [3]], ["a", "b"], ""])
        if rng.random() < 0.3:
            b["logprobs"] = rng.randrange(0, 5)
    elif path == "/tokenize":
        b = {"prompt": "some text"} if rng.random() < 0.5 else {"messages": msgs}
    elif path == "/detokenize":
        b = {"tokens": [rng.randrange(-5, 2000) for _ in range(rng.randrange(0, 20))]}
    for k, v in (("n", rng.randrange(1, 4)), ("stop", ["e", "o"]), ("seed", rng.randrange(-5, 5)), ("top_k", 5),
                 ("stream_options", {"include_usage": True}), ("stop_token_ids", [1, 2]), ("echo", True)):
        if rng.random() < 0.15:
            b[k] = v
    return b


def mutate(rng, b):
    b = dict(b)
    for _ in range(rng.randrange(0, 4)):
        op = rng.randrange(4)
        keys = list(b)
        if op == 0 and keys:
            del b[rng.choice(keys)]
        elif op == 1 and keys:
            b[rng.choice(keys)] = rng.choice(WEIRD)
        elif op == 2:
            b[rng.choice(["bogus", "n", "max_tokens", "messages", "prompt", "tools", "stop", "top_p", "min_p"])] = \
                rng.choice(WEIRD)
        else:
            b = rng.choice([b, [b], "s", None])
            if not isinstance(b, dict):
                return b
    return b


def encode(rng, b):
    t = json.dumps(b).encode()
    r = rng.random()
    if r < 0.1 and t:
        i = rng.randrange(len(t))
        t = t[:i] + bytes([rng.randrange(256)]) + t[i + 1:]
    elif r < 0.15:
        t = t[:rng.randrange(len(t) + 1)]
    elif r < 0.18:
        t = t.replace(b'"', b"'", 1)
    return t


def send(port, path, data, rng, timeout=60):
    """Sends one request (whole or chunked, maybe cut), reads some or all of the answer; returns the status
    line's code or None when the client itself cut the exchange."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        method = b"GET" if path in ("/v1/models", "/health", "/metrics") and rng.random() < 0.9 else b"POST"
        cut = rng.random() < 0.1
        if rng.random() < 0.2:
            s.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" % (
                method, path.encode()))
            pos = 0
            while pos < len(data):
                k = rng.randrange(1, 64)
                s.sendall(b"%x\r\n%s\r\n" % (len(data[pos:pos + k]), data[pos:pos + k]))
                pos += k
            if cut:
                return None
            s.sendall(b"0\r\n\r\n")
        else:
            s.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (
                method, path.encode(), len(data)) + (data[:len(data) // 2] if cut else data))
            if cut:
                return None
        got = b""
        limit = rng.choice([64, 1 << 30])
        while len(got) < limit:
            piece = s.recv(65536)
            if not piece:
                break
            got += piece
        if not got.startswith(b"HTTP/1.1 "):
            raise AssertionError("no status line: %r" % got[:80])
        status = int(got[9:12])
        if limit > len(got) and status >= 400 and b"\r\n\r\n" in got:
            body = got.split(b"\r\n\r\n", 1)[1]
            if b"chunked" not in got.split(b"\r\n\r\n", 1)[0].lower():
                e = json.loads(body)
                if set(e.get("error", {})) != {"message", "type", "param", "code"}:
                    raise AssertionError("error not OpenAI-shaped: %r" % body[:200])
        return status
    finally:
        s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k3c", default=os.path.join(ROOT, "build", "k3c"))
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print("serve_fuzz: seed %d, %d requests" % (seed, a.requests), flush=True)
    statuses = {}
    with Server(k3c=a.k3c, args=["--max-seqs", "8", "--kv-blocks", "48", "--max-body", "64K"], ready_timeout=300) as srv:
        t0 = time.time()
        for i in range(a.requests):
            path = rng.choice(PATHS)
            data = encode(rng, mutate(rng, base_body(rng, path)))
            try:
                st = send(srv.port, path, data, rng)
            except (ConnectionError, socket.timeout) as e:
                st = "conn:" + type(e).__name__
            except AssertionError as e:
                print("FAIL: request %d to %s: %s\n  body %r" % (i, path, e, data[:300]))
                sys.exit(1)
            statuses[st] = statuses.get(st, 0) + 1
            if srv.proc.poll() is not None:
                print("FAIL: the server died at request %d (%s, body %r):\n%s" % (i, path, data[:300], srv.log_text()[-4000:]))
                sys.exit(1)
        alive = srv.request("GET", "/health")[0] == 200
        took = time.time() - t0
    log = srv.log_text()
    bad = [l for l in log.splitlines() if "Sanitizer" in l or "runtime error" in l]
    print("statuses: %s; %.1f s" % (", ".join("%s: %d" % (k, v) for k, v in sorted(statuses.items(), key=str)), took))
    if not alive or srv.returncode != 0 or bad:
        print("FAIL: alive %s, exit status %s, sanitizer lines:\n%s" % (alive, srv.returncode, "\n".join(bad[:20])))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
