#!/bin/sh
# The GPU entry point of tools/train_k3: trains, quantizes, evaluates and exports the K3-architecture fortune
# model in one run (at most 5 minutes of training on one H200, under 9 minutes in all).
#
#   tools/train_k3/train.sh --data DIR --out OUT [more train.py options]
#
# DIR: prepare_data.sh's output (train.txt, valid.txt, heldout.txt). OUT/model is the checkpoint; OUT/metrics.json,
# OUT/train.log and OUT/loss.png the record. While the model trains, a CPU-only k3c is built beside it
# (BUILD_K3C=0 skips; cJSON from tools/debs when the host has no libcjson-dev, as tools/gpu-check.sh does), and
# the exported checkpoint is then checked against k3c's CPU engine: check_export.py --model (logits, f32 and
# bf16) into OUT/check_export.txt, eval_k3c.py (the held-out perplexity by the engine) into OUT/eval_k3c.txt.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=
prev=
for a in "$@"; do
    [ "$prev" = "--out" ] && out=$a
    prev=$a
done
[ -n "$out" ] || { echo "usage: $0 --data DIR --out OUT [train.py options]" >&2; exit 2; }
mkdir -p "$out"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python3 -c 'import torch, tiktoken; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'

build=$root/build-train-k3
bpid=
if [ "${BUILD_K3C:-1}" = 1 ]; then
    (
        cd "$root"
        if ! printf '#include <cjson/cJSON.h>\n' | ${CC:-cc} -E -x c - >/dev/null 2>&1; then
            prefix=$build/debs-root
            mkdir -p "$prefix"
            for f in tools/debs/libcjson*.deb; do dpkg -x "$f" "$prefix"; done
            libdir=$(dirname "$(find "$prefix" -name 'libcjson.so*' | head -1)")
            export CFLAGS="-O2 -g -I$prefix/usr/include"
            export LDLIBS="-L$libdir -Wl,-rpath,$libdir"
        fi
        # PCRE2 likewise, linked statically from the committed libpcre2-dev (as tools/gpu-check.sh does)
        if ! printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <pcre2.h>\n' | ${CC:-cc} -E -x c - >/dev/null 2>&1; then
            prefix=$build/debs-root
            mkdir -p "$prefix"
            dpkg -x tools/debs/libpcre2-dev*.deb "$prefix"
            libdir=$(dirname "$(find "$prefix" -name 'libpcre2-8.a' | head -1)")
            export CFLAGS="${CFLAGS:--O2 -g} -I$prefix/usr/include"
            export LDLIBS="${LDLIBS:-} -L$libdir"
        fi
        nice make NVCC= -j8 BUILD="$build" "$build/k3c"
    ) >"$out/k3c-build.log" 2>&1 &
    bpid=$!
fi

python3 "$here/train.py" "$@"

if [ -n "$bpid" ] && wait "$bpid" && [ -x "$build/k3c" ]; then
    status=0
    python3 "$here/check_export.py" --k3c "$build/k3c" --model "$out/model" >"$out/check_export.txt" 2>&1 || status=1
    cat "$out/check_export.txt"
    for mode in "" --f32; do
        python3 "$here/eval_k3c.py" --k3c "$build/k3c" --model "$out/model" $mode 2>&1 | tee -a "$out/eval_k3c.txt" || status=1
    done
    exit $status
elif [ -n "$bpid" ]; then
    echo "k3c build failed (log: $out/k3c-build.log): engine checks skipped"
    tail -5 "$out/k3c-build.log"
fi
