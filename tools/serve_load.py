#!/usr/bin/env python3
"""Load test of `k3c serve` (loopback, standard library only): many concurrent SSE streams, a share of them
cut off at random points (before the first byte, while queued, while decoding), a few clients sending
garbage, on a cache sized so that the scheduler preempts. Checks: the server never crashes (it answers
/health throughout and exits 0 on SIGTERM), every stream that was not cut completes and equals the output
its prompt gives alone, and /metrics comes back to 0 running, 0 waiting and 0 blocks in use.

    python3 tools/serve_load.py [--streams 500] [--cancel 0.3] [--garbage 8] [--k3c build/k3c] [--seed S]

Greedy outputs are compared bit for bit with the release (bf16) arithmetic: the scheduler keeps batch
invariance through batching, preemption and prefix hits (--exact-f32 runs the engine's f32 diagnostic
instead). Prompts come in families sharing a 192-token head, so later ones hit the prefix cache (hits sit
on the prefix grid, 128 tokens with the engine's default blocks). Prints the figures and exits 1 on a
failure."""

import argparse
import asyncio
import json
import os
import random
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_common import ROOT, Server, finish_reason, joined_text, stream, wait_for  # noqa: E402


def body(prompt, n, streaming):
    return {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "skip_special_tokens": False,
            "stream": streaming}


async def garbage_client(port, rng, sent):
    """Malformed requests of several kinds until cancelled (sent[0] counts them): each must be refused or
    dropped, nothing else."""
    while True:
        k = rng.randrange(7)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
            if k == 0:  # random bytes
                writer.write(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 2048))))
            elif k == 1:  # a body that is not JSON
                b = bytes(rng.randrange(32, 127) for _ in range(rng.randrange(1, 512)))
                writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
            elif k == 2:  # a body shorter than its length, then gone
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"messages\":")
            elif k == 3:  # a huge declared length
                writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n")
            elif k == 4:  # headers that never end
                writer.write(b"GET /health HTTP/1.1\r\nX: " + b"a" * rng.randrange(1, 8000))
            elif k == 5:  # wrong types, unknown fields, bad ids
                b = rng.choice([b'{"prompt": [1, -5]}', b'{"prompt": "x", "n": 1e9}', b'{"messages": [{"role": 5}]}',
                                b'{"prompt": [1], "max_tokens": 99999999}', b'{"prompt": [1], "bogus": 1}',
                                b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}'])
                path = b"/v1/chat/completions" if b"messages" in b else b"/v1/completions"
                writer.write(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (path, len(b)) + b)
            else:  # a valid stream, dropped after the headers
                b = b'{"prompt": [1, 2, 3], "max_tokens": 50, "stream": true}'
                writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
            await writer.drain()
            try:
                await asyncio.wait_for(reader.read(rng.randrange(1, 4096)), 0.5)
            except (asyncio.TimeoutError, ConnectionError):
                pass
            writer.close()
            sent[0] += 1
        except (ConnectionError, OSError, asyncio.TimeoutError):
            pass
        await asyncio.sleep(rng.random() * 0.05)


async def flood(srv, jobs, rng, garbage, timeout):
    sent = [0]
    garb = [asyncio.ensure_future(garbage_client(srv.port, random.Random(rng.random()), sent)) for _ in range(garbage)]

    async def one(job):
        prompt, n, cut = job
        if cut == 0:
            # gone before the first byte of the answer: send, then close at once (or after a moment in the queue)
            try:
                r, w = await asyncio.open_connection("127.0.0.1", srv.port)
                b = json.dumps(body(prompt, n, True)).encode()
                w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
                await w.drain()
                await asyncio.sleep(rng.random() * 0.5)
                w.close()
            except (ConnectionError, OSError):
                pass
            return None
        return await stream(srv.port, "/v1/completions", body(prompt, n, True), cut_after=cut, timeout=timeout)

    res = await asyncio.gather(*[one(j) for j in jobs], return_exceptions=True)
    for g in garb:
        g.cancel()
    await asyncio.gather(*garb, return_exceptions=True)
    return res, sent[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k3c", default=os.path.join(ROOT, "build", "k3c"))
    ap.add_argument("--streams", type=int, default=500)
    ap.add_argument("--cancel", type=float, default=0.3, help="share of streams cut off")
    ap.add_argument("--garbage", type=int, default=8, help="clients sending garbage meanwhile")
    ap.add_argument("--prompts", type=int, default=48, help="distinct prompts (each stream takes one)")
    ap.add_argument("--max-seqs", type=int, default=32)
    ap.add_argument("--kv-blocks", type=int, default=160, help="MLA cache blocks (16 tokens): small, so it preempts")
    ap.add_argument("--exact-f32", action="store_true", help="the engine's f32 diagnostic arithmetic")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print("serve_load: seed %d, %d streams, %.0f%% cut, %d garbage clients, %s" % (
        seed, a.streams, 100 * a.cancel, a.garbage, "exact f32" if a.exact_f32 else "bf16"), flush=True)
    # prompts in families sharing a 192-token head (prefix-cache hits at 128), with their own tails
    heads = [[rng.randrange(1, 700) for _ in range(192)] for _ in range(6)]
    prompts = []
    for i in range(a.prompts):
        tail = [rng.randrange(1, 700) for _ in range(rng.randrange(1, 40))]
        prompts.append((heads[i % len(heads)] + tail if i % 4 else tail + heads[0][:8], rng.randrange(8, 48)))
    args = ["--max-seqs", str(a.max_seqs), "--kv-blocks", str(a.kv_blocks), "--max-queue", str(4 * a.streams),
            "--max-connections", str(2 * a.streams + 64), "--grace", "5"] + (["--exact-f32"] if a.exact_f32 else [])
    srv = Server(k3c=a.k3c, args=args, ready_timeout=300)
    srv.start()
    failures = []
    t0 = time.time()
    try:
        solo = []
        for p, n in prompts:
            st, b = srv.request("POST", "/v1/completions", body(p, n, False))
            if st != 200:
                raise RuntimeError("solo request failed: %s %s" % (st, b))
            solo.append(b["choices"][0]["text"])
        t_solo = time.time() - t0
        m0 = srv.metrics()
        jobs, kinds = [], []
        for i in range(a.streams):
            k = rng.randrange(len(prompts))
            n = prompts[k][1]
            cut = None
            if rng.random() < a.cancel:
                # a fifth of the cuts before any answer, the others after a random number of events
                cut = 0 if rng.random() < 0.2 else rng.randrange(1, n + 1)
            jobs.append((prompts[k][0], n, cut))
            kinds.append(k)
        t1 = time.time()
        res, garbage_done = asyncio.run(flood(srv, jobs, rng, a.garbage, a.timeout))
        t_flood = time.time() - t1
        alive = srv.proc.poll() is None and srv.request("GET", "/health", timeout=10)[0] == 200
        if not alive:
            failures.append("the server died")
        complete = cut_n = differ = 0
        differ_idx = []
        for i, r in enumerate(res):
            prompt, n, cut = jobs[i]
            if cut is not None:
                cut_n += 1
                continue
            if isinstance(r, BaseException):
                failures.append("stream %d: %r" % (i, r))
                continue
            st, ev, done, _ = r
            if st != 200 or not done or finish_reason(ev) != "length":
                failures.append("stream %d: status %s, done %s, finish %s, last %s" % (i, st, done, finish_reason(ev),
                                                                                         ev[-1:] if ev else None))
                continue
            complete += 1
            if joined_text(ev) != solo[kinds[i]]:
                differ += 1
                differ_idx.append(i)
        settled = wait_for(lambda: (lambda m: m["k3c:num_requests_running"] == 0 and m["k3c:num_requests_waiting"] == 0
                                    and m["k3c:kv_cache_blocks_used"] == 0)(srv.metrics()), 10)
        m = srv.metrics()
        if not settled:
            failures.append("not back to idle: running %d, waiting %d, blocks in use %d" % (
                m["k3c:num_requests_running"], m["k3c:num_requests_waiting"], m["k3c:kv_cache_blocks_used"]))
        if differ:
            failures.append("%d completed streams differ from their solo output (e.g. stream %d)" % (differ, differ_idx[0]))
        preempt = m["k3c:num_preemptions_total"] - m0["k3c:num_preemptions_total"]
        hits = m["k3c:prefix_cache_hits_total"] - m0["k3c:prefix_cache_hits_total"]
        aborted = m['k3c:request_success_total{finished_reason="abort"}']
    finally:
        rc = srv.stop()
    if rc != 0:
        failures.append("exit status %s after SIGTERM" % rc)
    print("streams %d: %d completed (%d differ from solo%s), %d cut off (%d aborts counted by the server, garbage clients' dropped streams included); "
          "garbage connections %d; preemptions %d; prefix-cache hit tokens %d; "
          "at the end: running %d, waiting %d, blocks in use %d; crashes %d; exit status %s" % (
              a.streams, complete, differ, "", cut_n, aborted, garbage_done, preempt,
              hits, m["k3c:num_requests_running"], m["k3c:num_requests_waiting"], m["k3c:kv_cache_blocks_used"],
              0 if alive and rc == 0 else 1, rc))
    print("time: solo %.1f s, flood %.1f s, total %.1f s" % (t_solo, t_flood, time.time() - t0))
    if a.prompts and preempt == 0:
        print("note: no preemption happened (a larger --streams or a smaller --kv-blocks makes one)")
    for f in failures[:20]:
        print("FAIL: " + f)
    if failures:
        print("server log: " + srv.log_path)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
