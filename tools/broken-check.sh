#!/usr/bin/env bash
# The perplexity check against a deliberately broken kernel (make broken-check builds build-broken/k3c with
# -DK3C_BROKEN_KDA_GATE): the embedded model's held-out perplexity from that binary, next to the trainer's
# (models/k3-fortune/metrics.json) and the 1 % that build/test_k3c perplexity_cpu_matches_trainer allows.
# Exits 0 when the broken build lands far past it (more than 10 times the tolerance, or no finite number at
# all), 1 when it does not (the test would miss the bug).
#   tools/broken-check.sh [path/to/broken/k3c]   (default build-broken/k3c)
set -uo pipefail
cd "$(dirname "$0")/.."
K3C=${1:-build-broken/k3c}
out=$("$K3C" perplexity --file tools/train_k3/data/heldout.txt 2>&1)
rc=$?
echo "$out"
python3 - "$rc" "$out" <<'PY'
import json, math, re, sys
rc, out = int(sys.argv[1]), sys.argv[2]
ref = json.load(open("models/k3-fortune/metrics.json"))["perplexity"]["exported"]["heldout"]
m = re.search(r"^perplexity: (\S+)", out, re.M)
ppl = float(m.group(1)) if rc == 0 and m else float("nan")
if not math.isfinite(ppl):
    print("broken build: no finite perplexity (the trainer's %.4f; tolerance 1 %%): far past the tolerance" % ref)
    sys.exit(0)
rel = ppl / ref - 1
far = abs(rel) > 0.10
print("broken build: perplexity %.4f against the trainer's %.4f: %+.1f %%, %s the 1 %% tolerance" %
      (ppl, ref, 100 * rel, "far past" if far else "NOT far past"))
sys.exit(0 if far else 1)
PY
