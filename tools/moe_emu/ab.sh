#!/bin/bash
# Bitwise A/B of the routed-experts kernels under the emulator: moe.cu and moe_pair.cu of a git ref (B)
# against this tree's (A), every case of run.sh's mode on both (main.c, the cases and the other sources from
# this tree), each case's h, part and out dumped (EMU_DUMP) and the two dumps compared with cmp. Exit 0 when
# they are equal byte for byte. For kernel changes that must not move a bit (a new tiling, a new schedule).
# Usage: tools/moe_emu/ab.sh REF [quick|big|all]  (e.g. tools/moe_emu/ab.sh main quick; EMU_ONLY, EMU_WPR and
# the other settings of run.sh apply to both sides; TMPDIR: the work folders, default /tmp)
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
ref=${1:?usage: tools/moe_emu/ab.sh REF [quick|big|all]}
mode=${2:-quick}
work=${TMPDIR:-/tmp}/moe_emu_ab
rm -rf "$work/ref" && mkdir -p "$work/ref" "$work/b/moe_emu/gen/cuda"
git -C "$root" archive "$ref" src/cuda | tar -x -C "$work/ref"
# B's declarations (moe_pair.h) ahead of this tree's: run.sh puts $TMPDIR/moe_emu/gen before src/
cp "$work/ref/src/cuda/moe_pair.h" "$work/b/moe_emu/gen/cuda/moe_pair.h"
MOE_CU="$work/ref/src/cuda/moe.cu" MOE_PAIR_CU="$work/ref/src/cuda/moe_pair.cu" EMU_DUMP="$work/b.bin" \
    TMPDIR="$work/b" bash "$here/run.sh" "$mode" >"$work/b.log" 2>&1 || { echo "ab: $ref failed ($work/b.log)"; exit 1; }
EMU_DUMP="$work/a.bin" TMPDIR="$work/a" bash "$here/run.sh" "$mode" >"$work/a.log" 2>&1 ||
    { echo "ab: this tree failed ($work/a.log)"; exit 1; }
grep -h "^moe_emu: [0-9]" "$work/b.log" "$work/a.log"
if cmp -s "$work/a.bin" "$work/b.bin"; then
    echo "ab: h, part and out bitwise equal to $ref ($(stat -c %s "$work/a.bin") bytes; logs $work/a.log, $work/b.log)"
else
    echo "ab: outputs differ from $ref (cmp $work/a.bin $work/b.bin)"
    exit 1
fi
