#!/usr/bin/env bash
# GPU tests on the GPU host without compiling CUDA there: the CUDA objects come from this repository's build
# folder on the machine that sent the tree (compiled with the same nvcc, 13.0 on both in 2026-12), the C files
# compile on the host (~10 s with 16 cores against ~100 s for a whole build), then build/test_gpu runs with the
# arguments given. Seen on the H200 on 2026-12-02: built in 10 s, no nvcc run, the tests passed.
#
# Here, first: `make -j2 all gpu-test` (every CUDA object current: a build folder copied and touched holds stale
# ones; when in doubt delete build/src and build again). Then the device command, the object folders carried
# (device tool: carry ["build/src/cuda", "build/src/comm"]):
#   bash tools/gpu-prebuilt.sh gpu_wide_hybrid gpu_wide_dep
# Environment: TARGETS (make targets, default build/test_gpu), TIMEOUT (seconds for the tests, default 300).
# A full check of record still builds everything there (tools/gpu-fresh.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
export BUILD=build
. tools/gpu-deps.sh
export CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_MODULE_LOADING=EAGER
t0=$(date +%s)
ls build/src/cuda/*.o >/dev/null 2>&1 || { echo "gpu-prebuilt: no build/src/cuda/*.o (carry them)" >&2; exit 1; }
# the flags stamp follows this host's CFLAGS (gpu-deps.sh's include paths), which would rebuild every object
# that depends on it: write it first, then make the carried objects newer than it and than their sources
make BUILD=build build/.flags >/dev/null 2>&1
find build/src/cuda build/src/comm -name '*.o' -exec touch {} +
log=${OUT:-/tmp}/gpu-prebuilt-build.log
if ! make -j"${JOBS:-16}" BUILD=build ${TARGETS:-build/test_gpu} >"$log" 2>&1; then
    tail -30 "$log"
    echo "gpu-prebuilt: build failed ($log)" >&2
    exit 1
fi
n=$(grep -c nvcc "$log")
echo "gpu-prebuilt: built in $(($(date +%s) - t0)) s, $n nvcc runs (0 expected)"
[ $# -gt 0 ] || exit 0
timeout "${TIMEOUT:-300}" build/test_gpu "$@"
