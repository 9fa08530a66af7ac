#!/usr/bin/env python3
"""Predicted step times of the persistent decode kernel and the MXFP4 expert kernel from a block-stamp report
(docs/decode-limits.md section 3 has the model; tools/gpu-measure.sh writes the reports and runs this).

  T_pk = sum_c B_c / (eta_c BW)                      every class's bytes at its steady streaming rate
       + N_moe (c + lam_x)                            the routed experts' start: their weights follow routing
       + sum_{i latency-bound} max(0, lam_i + c - B_i / (eta_c BW))   what the weight stream cannot hide

B_c: the STAMPCLASS bytes; eta_c: the class's best span rate among its ops of >= 16 MB, capped (--cap), or
--eta-gemv etc.; experts: their measured span rate, or --eta-experts (the MXFP4 kernel's target); lam_i: an
op's first tile after its dependency released it (STAMPOP fend - wait; fend when it has no wait), c the counter
hand-off (--c-us). Latency-bound ops: the classes KDA, MLA, moe-f/t, AR/norm, argmax and ops under 16 MB.
Usage: stamp_predict.py REPORT.txt [...] [--eta-experts 0.6] [--c-us 1.0] [--cap 0.92]
"""
import argparse
import re
import sys

NUM = 13  # numeric columns at the end of a STAMPOP line: L blocks start ramp wait fend drain span gap MB GBs GBs copy


def parse(path):
    steps = {}
    for line in open(path, errors="replace"):
        t = line.split()
        if len(t) < 4:
            continue
        if t[0] == "STAMPOP" and t[3] != "#":
            key = (t[1], t[2])
            num = t[-NUM:]
            try:
                vals = [float(x) for x in num]
            except ValueError:
                continue
            name = " ".join(t[4:-NUM - 1]).rstrip(" *")
            steps.setdefault(key, {"ops": [], "bw": 0, "gpu": 0, "floor": 0})["ops"].append(
                dict(name=name, cls=t[-NUM - 1], L=vals[0], wait=vals[4], fend=vals[5], span=vals[7], gap=vals[8],
                     mb=vals[9], gbs_span=vals[10]))
        elif t[0] == "STAMPSTEP":
            key = (t[1], t[2])
            m = re.search(r"gpu_us ([\d.]+).*floor ([\d.]+) us at (\d+) GB/s", line)
            if m and key in steps:
                steps[key].update(gpu=float(m.group(1)), floor=float(m.group(2)), bw=float(m.group(3)))
    return steps


def predict(step, a):
    ops, bw = step["ops"], step["bw"]  # bw: GB/s = bytes per ns... MB / (GB/s) = ms / 1e3 -> us: MB / bw * 1e3
    if not bw:
        return None
    eta = {}
    for o in ops:  # steady rate per class: the best span rate of its big ops
        if o["mb"] >= 16 and o["span"] > 0:
            eta[o["cls"]] = max(eta.get(o["cls"], 0), o["gbs_span"] / bw)
    for c in list(eta):
        eta[c] = min(eta[c], a.cap)
    if a.eta_gemv:
        eta["GEMV"] = eta["lm-head"] = a.eta_gemv
    if a.eta_experts:
        eta["experts"] = a.eta_experts
    stream = lat = start = 0.0
    n_moe = 0
    for o in ops:
        e = eta.get(o["cls"], a.cap if o["cls"] in ("GEMV", "lm-head") else 0.8)
        t_stream = o["mb"] / (e * bw) * 1e3  # us
        stream += t_stream
        lam = (o["fend"] - o["wait"]) if o["wait"] == o["wait"] else o["fend"]  # NaN wait: no PDL wait
        if o["cls"] == "experts":
            n_moe += 1
            start += a.c_us + max(0.0, lam)
        elif o["cls"] in ("KDA", "MLA", "moe-f/t", "AR/norm", "argmax", "other") or o["mb"] < 16:
            lat += max(0.0, lam + a.c_us - t_stream)
    return dict(stream=stream, lat=lat, start=start, n_moe=n_moe, total=stream + lat + start, eta=eta)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("reports", nargs="+")
    ap.add_argument("--eta-experts", type=float, default=0.0, help="experts' rate (0: as measured)")
    ap.add_argument("--eta-gemv", type=float, default=0.0, help="GEMV / LM head rate (0: as measured, capped)")
    ap.add_argument("--c-us", type=float, default=1.0, help="counter hand-off per dependency, us")
    ap.add_argument("--cap", type=float, default=0.92, help="cap on a measured steady rate")
    a = ap.parse_args()
    for path in a.reports:
        for (b, q), st in parse(path).items():
            p = predict(st, a)
            if not p:
                print(f"PREDICT {path} {b} {q}: no STAMPSTEP bandwidth")
                continue
            fl = st["floor"]
            print(f"PREDICT {path.split('/')[-1]} {b} {q}: stamped graph {st['gpu'] / 1e3:.3f} ms; persistent "
                  f"{p['total'] / 1e3:.3f} ms = stream {p['stream'] / 1e3:.3f} + exposed latency {p['lat'] / 1e3:.3f} + "
                  f"expert starts {p['start'] / 1e3:.3f} ({p['n_moe']} MoE layers); floor {fl / 1e3:.3f} ms: "
                  f"{fl / p['total']:.3f} of floor (eta: " +
                  ", ".join(f"{k} {v:.2f}" for k, v in sorted(p["eta"].items())) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
