#!/usr/bin/env python3
"""Serving benchmark of `k3c serve` (loopback, standard library only), with the definitions of
`vllm bench serve`:
  TTFT  send -> the first streamed token (the first chunk with text);
  TPOT  per request (E2E - TTFT) / (output tokens - 1);
  ITL   every gap between two streamed chunks, pooled over requests (one chunk may carry several tokens
        with speculation, so ITL counts per event and TPOT per token);
  E2EL  send -> the last byte; throughputs over the level's wall time.
A sweep over concurrency levels (a fixed number of requests in flight) or request rates (Poisson arrivals),
random token prompts (distinct per request, so the prefix cache does not inflate the numbers) of
--input-len ids, --output-len tokens each (ignore_eos). With --prefix-len N every prompt starts with the
same N ids (a system prompt), sent once before the levels, so the levels measure prefix-cache hits (the
cached column: mean cached_tokens per request). The engine's steps per route and the executor's share come
from /metrics before and after each level.

    python3 tools/serve_bench.py [--k3c build/k3c] [--concurrency 1,4,16] [--request-rate inf]
        [--num-prompts 32] [--input-len 128] [--output-len 64] [--prefix-len 0] [--server-args "..."]
        [--url http://host:port]

--url benchmarks a server already running (started by the caller); otherwise one is started with
--server-args. Prints a Markdown table (one row per level)."""

import argparse
import asyncio
import os
import random
import shlex
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_common import ROOT, Server, stream  # noqa: E402


class Remote:
    """A server the caller runs (--url): the same request / metrics helpers as Server."""

    def __init__(self, url):
        hostport = url.split("://", 1)[-1].rstrip("/")
        self.host, port = hostport.rsplit(":", 1)
        self.port = int(port)

    request = Server.request
    metrics = Server.metrics


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def one_request(port, prompt, out_len):
    body = {"prompt": prompt, "max_tokens": out_len, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    first = None
    times = []

    def on_event(e):
        nonlocal first
        ch = e.get("choices") or []
        if ch and ch[0].get("text"):
            now = time.monotonic()
            if first is None:
                first = now
            times.append(now)

    st, ev, done, _ = await stream(port, "/v1/completions", body, on_event=on_event, timeout=3600)
    end = time.monotonic()
    usage = next((e["usage"] for e in reversed(ev) if e.get("usage")), None)
    if st != 200 or not done or first is None or not usage:
        return None
    n_out = usage["completion_tokens"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"ttft": first - t0, "e2el": end - t0, "out": n_out, "in": usage["prompt_tokens"], "cached": cached,
            "tpot": (end - t0 - (first - t0)) / (n_out - 1) if n_out > 1 else None,
            "itl": [b - a for a, b in zip(times, times[1:])]}


async def run_level(port, prompts, out_len, concurrency, rate, rng):
    sem = asyncio.Semaphore(concurrency if concurrency > 0 else len(prompts))

    async def limited(p):
        async with sem:
            return await one_request(port, p, out_len)

    tasks = []
    t0 = time.monotonic()
    for p in prompts:
        tasks.append(asyncio.ensure_future(limited(p)))
        if rate != float("inf"):
            await asyncio.sleep(rng.expovariate(rate))
    res = await asyncio.gather(*tasks)
    return res, time.monotonic() - t0


def route_counts(m):
    routes = {r: m.get('k3c:engine_steps_total{route="%s"}' % r, 0) for r in ("stock", "decode", "verify", "wide")}
    return routes, m.get("k3c:executor_steps_total", 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k3c", default=os.path.join(ROOT, "build", "k3c"))
    ap.add_argument("--url", default=None)
    ap.add_argument("--server-args", default="")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--request-rate", default=None, help="comma list of req/s (Poisson); replaces --concurrency")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--prefix-len", type=int, default=0, help="ids every prompt starts with (prefix-cache hits)")
    ap.add_argument("--vocab", type=int, default=700, help="prompt ids are drawn from 1 .. vocab - 1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-executor", action="store_true",
                    help="fail unless the specialized executor ran the decode and verify steps (a CUDA server)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    srv = Remote(a.url) if a.url else Server(k3c=a.k3c, args=shlex.split(a.server_args), ready_timeout=3600).start()
    try:
        if a.request_rate:
            levels = [("rate", float(x)) for x in a.request_rate.split(",")]
        else:
            levels = [("concurrency", int(x)) for x in a.concurrency.split(",")]
        prefix = [rng.randrange(1, a.vocab) for _ in range(a.prefix_len)]
        # warm-up: one short request (graph capture, page faults), and the shared prefix once (its blocks and
        # KDA snapshot stay in the prefix cache)
        asyncio.run(one_request(srv.port, [rng.randrange(1, a.vocab) for _ in range(8)], 4))
        if prefix:
            asyncio.run(one_request(srv.port, prefix + [rng.randrange(1, a.vocab) for _ in range(a.input_len)], 2))
        print("| %s | reqs | req/s | out tok/s | total tok/s | TTFT mean / p50 / p99 ms | TPOT mean / p50 / p99 ms "
              "| ITL mean / p50 / p99 ms | E2EL mean ms | cached | steps | executor share | routes "
              "(stock/decode/verify/wide) |" % levels[0][0])
        print("|" + "---|" * 13)
        m_start = srv.metrics()
        for kind, v in levels:
            prompts = [prefix + [rng.randrange(1, a.vocab) for _ in range(a.input_len)] for _ in range(a.num_prompts)]
            r0, e0 = route_counts(srv.metrics())
            res, wall = asyncio.run(run_level(srv.port, prompts, a.output_len, v if kind == "concurrency" else 0,
                                              v if kind == "rate" else float("inf"), rng))
            r1, e1 = route_counts(srv.metrics())
            ok = [x for x in res if x]
            steps = sum(r1.values()) - sum(r0.values())
            routes = "/".join("%d" % (r1[k] - r0[k]) for k in ("stock", "decode", "verify", "wide"))
            ttft = [x["ttft"] * 1e3 for x in ok]
            tpot = [x["tpot"] * 1e3 for x in ok if x["tpot"] is not None]
            itl = [g * 1e3 for x in ok for g in x["itl"]]
            e2el = [x["e2el"] * 1e3 for x in ok]
            out_tok = sum(x["out"] for x in ok)
            in_tok = sum(x["in"] for x in ok)

            def trio(xs):
                return "%.1f / %.1f / %.1f" % (statistics.mean(xs), pct(xs, 50), pct(xs, 99)) if xs else "-"

            cached = statistics.mean(x["cached"] for x in ok) if ok else 0
            print("| %s | %d/%d | %.2f | %.1f | %.1f | %s | %s | %s | %.0f | %.0f | %d | %.0f%% | %s |" % (
                ("%g" % v) if kind == "rate" else v, len(ok), len(res), len(ok) / wall, out_tok / wall,
                (in_tok + out_tok) / wall, trio(ttft), trio(tpot), trio(itl), statistics.mean(e2el) if e2el else 0,
                cached, steps, 100.0 * (e1 - e0) / steps if steps else 0, routes), flush=True)
        if a.check_executor:
            r0, e0 = route_counts(m_start)
            r1, e1 = route_counts(srv.metrics())
            fast = (r1["decode"] - r0["decode"]) + (r1["verify"] - r0["verify"])
            print("executor: %d of %d decode + verify steps (%d steps in all)" % (e1 - e0, fast,
                                                                                   sum(r1.values()) - sum(r0.values())))
            if e1 - e0 <= 0 or e1 - e0 < fast:
                print("FAIL: decode / verify steps did not all run on the specialized executor")
                sys.exit(1)
    finally:
        if not a.url:
            srv.stop()


if __name__ == "__main__":
    main()
