#!/usr/bin/env bash
# Greedy streams of `k3c run` across batch sizes and speculation (docs/DESIGN.md, "Batch invariance"): 50
# prompts of 5..120 random token ids (Python's random.seed(1)) on the tiny preset (seed 0), -n 24, with
# --max-requests 50 as the reference against --max-requests 4, 1, --spec 3 and a small prefill budget;
# prints how many of the 50 output lines differ from the reference in each. CPU, a few seconds a run.
#   tools/invariance-check.sh [path/to/k3c]   (default build/k3c)
set -euo pipefail
K3C=${1:-build/k3c}
dir=$(mktemp -d /tmp/k3c-invariance-XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$K3C" synth --preset tiny --out "$dir/tiny" >/dev/null
python3 -c '
import random
random.seed(1)
print(";".join(",".join(str(random.randrange(1024)) for _ in range(random.randint(5, 120))) for _ in range(50)))
' >"$dir/prompts"
run() { "$K3C" run --model "$dir/tiny" --prompts "$(cat "$dir/prompts")" -n 24 "$@" 2>/dev/null; }
run --max-requests 50 >"$dir/ref"
for args in "--max-requests 4" "--max-requests 1" "--max-requests 50 --spec 3" "--max-requests 7 --spec 2 --prefill-budget 64"; do
    # shellcheck disable=SC2086
    run $args >"$dir/out"
    echo "$args: $(diff "$dir/ref" "$dir/out" | grep -c '^<' || true) of 50 streams differ from --max-requests 50"
done
