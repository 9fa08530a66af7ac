#!/usr/bin/env bash
# The multi-process bootstrap on a host of N GPUs (docs/PARALLEL.md, "Multi-process"): N processes of
# `k3c generate --device cuda --tp N --world-size N --rank R --rendezvous FILE`, one GPU each
# (CUDA_VISIBLE_DEVICES=R), then one rank alone. What it checks:
#   1. --exact-f32 (the stock forward over NCCL): every rank exits 0 within the timeout (no hang), no rank
#      reports an NCCL or rendezvous error, rank 0 prints the tokens of `k3c generate --tp 1` on one GPU (N = 2:
#      the embedded model; required), and has removed the rendezvous file;
#   2. bf16: every rank exits 0 and rank 0's route summary counts specialized steps (the executor over the
#      TP group's CUDA IPC mailbox, docs/PARALLEL.md "The engine at TP on CUDA");
#   3. rank 1 started alone times out at the rendezvous (--rank-timeout 5) naming the file, exit 1.
# Usage: tools/gpu-ranks-bootstrap.sh [N] (default 2; needs N GPUs and build/k3c built with nvcc).
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:-2}
K3C=${K3C:-build/k3c}
OUT=${OUT:-/tmp/k3c-ranks-bootstrap}
rm -rf "$OUT" && mkdir -p "$OUT"
RDV="$OUT/rdv"
# N = 2: the embedded model (2 KDA and 2 MLA heads), whose greedy margins are wide enough for the f32 tokens
# to be compared; more ranks: the tiny preset (random weights: the comparison is reported, not required)
if [ "$N" = 2 ]; then base=(generate --device cuda --prompt 'A penny saved is' -n 16 --ignore-eos); strict=1
else base=(generate --device cuda --preset tiny --prompt-ids 1,2,3 -n 8 --ignore-eos); strict=0; fi
args=("${base[@]}" --tp "$N" --world-size "$N" --rendezvous "$RDV" --rank-timeout 20)
fail=0
# the N ranks, one GPU each; $1: a tag for the logs, then extra options
run_ranks() {
    local tag=$1
    shift
    local pids=() r rc
    for ((r = 0; r < N; r++)); do
        CUDA_VISIBLE_DEVICES=$r timeout 120 "$K3C" "${args[@]}" "$@" --rank "$r" >"$OUT/$tag.rank$r.out" \
            2>"$OUT/$tag.rank$r.err" &
        pids+=($!)
    done
    for ((r = 0; r < N; r++)); do
        wait "${pids[$r]}"
        rc=$?
        echo "$tag rank $r: exit $rc: $(tail -1 "$OUT/$tag.rank$r.err")"
        if [ "$rc" = 124 ]; then echo "  FAIL: rank $r hung"; fail=1; fi
        if [ "$rc" != 0 ]; then echo "  FAIL: rank $r exit $rc (see $OUT/$tag.rank$r.err)"; fail=1; fi
        # k3c's message is the last line (NCCL's own WARN lines about an abort may come before it)
        if [ "$rc" != 0 ] && tail -1 "$OUT/$tag.rank$r.err" | grep -qiE 'nccl|rendezvous'; then
            echo "  FAIL: rank $r: an NCCL or rendezvous error"; fail=1
        fi
    done
}
run_ranks f32 --exact-f32
CUDA_VISIBLE_DEVICES=0 timeout 120 "$K3C" "${base[@]}" --exact-f32 >"$OUT/tp1.out" 2>"$OUT/tp1.err"
if ! cmp -s "$OUT/tp1.out" "$OUT/f32.rank0.out"; then
    echo "  rank 0's tokens differ from --tp 1's ($OUT/tp1.out, $OUT/f32.rank0.out)"; [ "$strict" = 1 ] && fail=1
fi
run_ranks bf16
if ! grep -Eq 'steps: [1-9][0-9]* specialized' "$OUT/bf16.rank0.err"; then
    echo "  FAIL: no step ran on the executor ($OUT/bf16.rank0.err)"; fail=1
fi
if [ -e "$RDV" ]; then echo "FAIL: rank 0 left $RDV behind"; fail=1; fi
CUDA_VISIBLE_DEVICES=1 timeout 60 "$K3C" "${args[@]}" --rank 1 --rank-timeout 5 \
    >"$OUT/alone.out" 2>"$OUT/alone.err"
rc=$?
echo "rank 1 alone: exit $rc: $(tail -1 "$OUT/alone.err")"
if [ "$rc" != 1 ] || ! grep -q 'no usable record from rank 0' "$OUT/alone.err"; then echo "  FAIL"; fail=1; fi
[ "$fail" = 0 ] && echo "gpu-ranks-bootstrap: ok ($N ranks)" || echo "gpu-ranks-bootstrap: FAILED (logs in $OUT)"
exit "$fail"
