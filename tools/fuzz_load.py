#!/usr/bin/env python3
"""Structured mutations of a synthesized checkpoint, each loaded end to end by the k3c CLI.

`make fuzz` (libFuzzer) covers the safetensors header and index parsers byte by byte; this covers what
they hand on: config.json values the config parser must refuse or accept, safetensors headers whose
offsets, shapes or dtypes no longer match the index or the config, truncated shards, a broken index.
Each mutated checkpoint goes through `k3c inspect DIR` and `k3c generate --model DIR -n 2`, which must
exit 0, or exit 1 or 2 with a message on stderr; a signal, a sanitizer report, a hang, or a failure
without a message is a finding. Build k3c with ASan + UBSan for this (`make fuzz-load` does).

Usage: tools/fuzz_load.py [--k3c build-asan/k3c] [--iterations 500] [--seed S] [--preset tiny]
                          [--mutations K] [--out DIR]
Prints the seed (replay with --seed), a line per finding, and a summary of exit codes; each finding's
checkpoint is kept under DIR/finding-N with the command that failed. Exit 1 if there were findings.
"""
import argparse
import collections
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

SPECIAL_VALUES = [0, -1, 1, 2, 3, 7, 4096, 65536, 2**31 - 1, -2**31, 2**40, 1e30, -0.5, 0.5, None, "x", [], {},
                  True]


def leaf_paths(o, path=()):
    if isinstance(o, dict):
        return [p for k, v in o.items() for p in leaf_paths(v, path + (k,))]
    if isinstance(o, list):
        return [p for i, v in enumerate(o) for p in leaf_paths(v, path + (i,))]
    return [path]


def mutate_config(rng, d):
    """one leaf of config.json set to an edge value"""
    f = os.path.join(d, 'config.json')
    c = json.load(open(f))
    p = rng.choice(leaf_paths(c))
    o = c
    for k in p[:-1]:
        o = o[k]
    o[p[-1]] = rng.choice(SPECIAL_VALUES)
    json.dump(c, open(f, 'w'))
    return 'config.json %s = %r' % ('.'.join(map(str, p)), o[p[-1]])


def mutate_shard(rng, d):
    """a shard's header byte, header length or one number in it changed, or the shard truncated"""
    name = rng.choice(sorted(n for n in os.listdir(d) if n.endswith('.safetensors')))
    f = os.path.join(d, name)
    b = bytearray(open(f, 'rb').read())
    # the header as it stands, which an earlier mutation of this copy may have cut or mislabelled
    hl = min(int.from_bytes(b[:8], 'little'), max(len(b) - 8, 0))
    h = b[8:8 + hl].decode('utf-8', 'replace')
    nums = list(re.finditer(r'\d+', h))
    kind = rng.randrange(4)
    if (kind == 0 and hl == 0) or (kind == 2 and not nums) or len(b) < 9:
        kind = 1
    if kind == 0:
        i = 8 + rng.randrange(hl)
        b[i] = rng.randrange(256)
        what = 'header byte %d = %d' % (i, b[i])
    elif kind == 1:
        v = rng.choice([0, 1, 7, max(hl - 1, 0), hl + 1, len(b), 2**40, 2**64 - 1])
        b[:8] = v.to_bytes(8, 'little')
        what = 'header length %d' % v
    elif kind == 2:
        m = rng.choice(nums)
        old = int(m.group())
        nv = rng.choice([0, 1, 2**31, 2**63, 99999999, old + 1, max(old - 1, 0)])
        hb = (h[:m.start()] + str(nv) + h[m.end():]).encode()
        b = bytearray(len(hb).to_bytes(8, 'little')) + hb + b[8 + hl:]
        what = 'header number %d -> %d' % (old, nv)
    else:
        n = rng.randrange(max(len(b), 1))
        b = b[:n]
        what = 'truncated to %d bytes' % n
    open(f, 'wb').write(b)
    return '%s %s' % (name, what)


def mutate_index(rng, d):
    """one character of model.safetensors.index.json replaced or removed (a single-file checkpoint: a shard
    mutation instead)"""
    f = os.path.join(d, 'model.safetensors.index.json')
    if not os.path.exists(f):
        return mutate_shard(rng, d)
    s = open(f).read()
    i = rng.randrange(len(s))
    c = rng.choice(['"', '0', '}', 'x', '', '9999'])
    open(f, 'w').write(s[:i] + c + s[i + 1:])
    return 'index.json char %d -> %r' % (i, c)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--k3c', default='build-asan/k3c')
    ap.add_argument('--iterations', type=int, default=500)
    ap.add_argument('--seed', type=int, default=None)
    ap.add_argument('--preset', default='tiny')
    ap.add_argument('--mutations', type=int, default=1, help='mutations applied to each copy (1..K, random)')
    ap.add_argument('--out', default=None, help='where findings are kept (default: a new temp dir)')
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(2**32)
    out = a.out or tempfile.mkdtemp(prefix='k3c-fuzz-load-')
    os.makedirs(out, exist_ok=True)
    base, work = os.path.join(out, 'base'), os.path.join(out, 'work')
    findings = 0
    try:
        findings = run(a, seed, out, base, work)
    finally:
        # the scratch copies always go; the folder stays only for what it holds: findings, or a --out given
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
        if a.out is None and not findings:
            shutil.rmtree(out, ignore_errors=True)
    sys.exit(1 if findings else 0)


def run(a, seed, out, base, work):
    rng = random.Random(seed)
    shutil.rmtree(base, ignore_errors=True)
    r = subprocess.run([a.k3c, 'synth', '--preset', a.preset, '--out', base, '--seed', str(seed % 1000)],
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit('fuzz_load: %s synth failed: %s' % (a.k3c, r.stderr.strip()))
    print('fuzz_load: seed %d, %d iterations, preset %s, findings under %s (removed if none)' %
          (seed, a.iterations, a.preset, out), flush=True)
    env = dict(os.environ, ASAN_OPTIONS='detect_leaks=0', UBSAN_OPTIONS='print_stacktrace=1')
    codes = collections.Counter()
    findings = 0
    for it in range(a.iterations):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, work)
        what = '; '.join(rng.choice([mutate_config, mutate_shard, mutate_shard, mutate_index])(rng, work)
                         for _ in range(rng.randint(1, max(1, a.mutations))))
        for cmd in ([a.k3c, 'inspect', work], [a.k3c, 'generate', '--model', work, '-n', '2']):
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, errors='replace', timeout=120, env=env)
                rc, err = r.returncode, r.stderr
            except subprocess.TimeoutExpired:
                rc, err = 'timeout', ''
            codes[(cmd[1], rc)] += 1
            bad = (rc == 'timeout' or rc < 0 or rc not in (0, 1, 2) or 'Sanitizer' in err or 'runtime error:' in err
                   or (rc != 0 and not err.strip()))
            if bad:
                findings += 1
                keep = os.path.join(out, 'finding-%d' % findings)
                shutil.copytree(work, keep)
                replay = ' '.join(keep if c == work else c for c in cmd)  # the kept copy, not the scratch dir
                open(os.path.join(keep, 'FINDING.txt'), 'w').write('%s\n%s\nexit %s\n%s' % (what, replay, rc, err))
                print('FINDING %d (iteration %d): %s: %s exit %s: %s' % (findings, it, what, cmd[1], rc,
                                                                         err.strip()[-400:].replace('\n', ' | ')),
                      flush=True)
    summary = ', '.join('%s exit %s: %d' % (c, rc, n) for (c, rc), n in sorted(codes.items(), key=str))
    print('fuzz_load: %d iterations, %d findings (%s)' % (a.iterations, findings, summary), flush=True)
    return findings


if __name__ == '__main__':
    main()
