#!/usr/bin/env bash
# The decode benchmark over the whole report matrix: every benchmark preset
# (k3-slice, kimi-linear-48b, k3-tp8-rank) at batch 1, 2, 4, 8, 16, 32, 64 and verify width q 1, 2, 4, 8,
# stock and specialized side by side (`k3c bench --device cuda`: STEP and
# SPEC lines, floor and fraction of floor from the copy bandwidth it measures), then the transformers peer
# (tools/hf_peer_bench.py, kimi-linear-48b, batch 1 and 8, with flash-linear-attention's wheels from .whl/
# when present). Builds through tools/gpu-check.sh first when $BUILD has no k3c. Shapes the executor does
# not prepare (rows = batch x q over 64) print "runs stock". Under a limit of 10 minutes a command, run
# it as two calls, `PEER=0 bash tools/gpu-bench-matrix.sh`, then `PRESETS= bash tools/gpu-bench-matrix.sh`
# (H200, 2026-11-30: the three presets took ~230 s together, the peer alone ~60 s).
#
# Output: $OUT/matrix_<preset>.txt, $OUT/peer.txt and the STEP / SPEC / RATIO / PEER lines. Environment:
# BUILD (default build), OUT (default /tmp/k3c-bench-matrix), CONTEXT (tokens per request, default 256),
# PRESETS (default "k3-slice kimi-linear-48b k3-tp8-rank"), PEER (1: run the peer, default 1), K3C_PDL and
# the other K3C_* knobs pass through.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/k3c-bench-matrix}
CONTEXT=${CONTEXT:-256}
PRESETS=${PRESETS-"k3-slice kimi-linear-48b k3-tp8-rank"} # set and empty: none (the peer alone)
PEER=${PEER:-1}
mkdir -p "$OUT"
if ! [ -x "$BUILD/k3c" ]; then
    echo "gpu-bench-matrix: building through tools/gpu-check.sh"
    OUT="$OUT/build" BUILD="$BUILD" TESTS=gpu_router SANITIZE=0 KBENCH=0 BENCH=0 bash tools/gpu-check.sh >/dev/null 2>&1 ||
        { echo "gpu-bench-matrix: build failed ($OUT/build/build.log)" >&2; exit 1; }
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || true
git log --oneline -1 2>/dev/null || true

rc=0
for preset in $PRESETS; do
    echo "== $preset (context $CONTEXT)"
    timeout 180 "$BUILD/k3c" bench --device cuda --preset "$preset" --batches 1,2,4,8,16,32,64 --verify 1,2,4,8 \
        --context "$CONTEXT" >"$OUT/matrix_$preset.txt" 2>&1 || rc=1
    grep -E '^(bench |STEP|SPEC|RATIO)' "$OUT/matrix_$preset.txt"
done

if [ "$PEER" = 1 ]; then
    echo "== peer: transformers KimiLinearForCausalLM, kimi-linear-48b config"
    if ls .whl/*.whl >/dev/null 2>&1; then
        pip install --no-deps --quiet --target "$OUT/pylib" .whl/*.whl >/dev/null 2>&1 &&
            export PYTHONPATH="$OUT/pylib${PYTHONPATH:+:$PYTHONPATH}"
    fi
    "$BUILD/k3c" synth --preset kimi-linear-48b --out "$OUT/kl48" >/dev/null 2>&1 || rc=1
    timeout 200 python3 tools/hf_peer_bench.py --config "$OUT/kl48" --batches 1,8 --context "$CONTEXT" --steps 6 \
        --warmup 2 >"$OUT/peer.txt" 2>&1 || rc=1
    grep -E '^PEER|fla|kernel' "$OUT/peer.txt" | head -12
fi
exit $rc
