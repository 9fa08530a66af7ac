#!/usr/bin/env bash
# The multi-process bootstrap on a host of N GPUs (docs/PARALLEL.md, "Multi-process"): N processes of
# `k3c generate --device cuda --tp N --world-size N --rank R --rendezvous FILE`, one GPU each
# (CUDA_VISIBLE_DEVICES=R), then one rank alone. What it checks today, while the CUDA backend has no
# tensor-parallel ops:
#   1. every rank gets through the rendezvous file and NCCL's communicator creation, then stops where the
#      forward refuses TP on CUDA ("has no tensor-parallel ops"), exit 1, within the timeout (no hang), and no
#      rank reports an NCCL or rendezvous error; rank 0 has removed the rendezvous file;
#   2. rank 1 started alone times out at the rendezvous (--rank-timeout 5) naming the file, exit 1.
# Once the CUDA backend has round / moe_partial, step 1 should instead print the same tokens on rank 0 as
# `k3c generate --tp 1` (compare by hand, or extend this script).
# Usage: tools/gpu-ranks-bootstrap.sh [N] (default 2; needs N GPUs and build/k3c built with nvcc).
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:-2}
K3C=${K3C:-build/k3c}
OUT=${OUT:-/tmp/k3c-ranks-bootstrap}
rm -rf "$OUT" && mkdir -p "$OUT"
RDV="$OUT/rdv"
args=(generate --device cuda --preset tiny --prompt-ids 1,2,3 -n 4 --tp "$N" --world-size "$N" --rendezvous "$RDV"
      --rank-timeout 20)
fail=0
pids=()
for ((r = 0; r < N; r++)); do
    CUDA_VISIBLE_DEVICES=$r timeout 120 "$K3C" "${args[@]}" --rank "$r" >"$OUT/rank$r.out" 2>"$OUT/rank$r.err" &
    pids+=($!)
done
for ((r = 0; r < N; r++)); do
    wait "${pids[$r]}"
    rc=$?
    echo "rank $r: exit $rc: $(tail -1 "$OUT/rank$r.err")"
    if [ "$rc" = 124 ]; then echo "  FAIL: rank $r hung"; fail=1; fi
    # k3c's message is the last line (NCCL's own WARN lines about the abort may come before it)
    if tail -1 "$OUT/rank$r.err" | grep -qiE 'nccl|rendezvous'; then echo "  FAIL: rank $r: an NCCL or rendezvous error"; fail=1; fi
    if ! grep -q 'tensor-parallel ops' "$OUT/rank$r.err" && [ "$rc" != 0 ]; then
        echo "  FAIL: rank $r stopped before the forward (see $OUT/rank$r.err)"; fail=1
    fi
done
if [ -e "$RDV" ]; then echo "FAIL: rank 0 left $RDV behind"; fail=1; fi
CUDA_VISIBLE_DEVICES=1 timeout 60 "$K3C" "${args[@]}" --rank 1 --rank-timeout 5 \
    >"$OUT/alone.out" 2>"$OUT/alone.err"
rc=$?
echo "rank 1 alone: exit $rc: $(tail -1 "$OUT/alone.err")"
if [ "$rc" != 1 ] || ! grep -q 'no usable record from rank 0' "$OUT/alone.err"; then echo "  FAIL"; fail=1; fi
[ "$fail" = 0 ] && echo "gpu-ranks-bootstrap: ok ($N ranks)" || echo "gpu-ranks-bootstrap: FAILED (logs in $OUT)"
exit "$fail"
