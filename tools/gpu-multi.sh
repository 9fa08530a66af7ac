#!/usr/bin/env bash
# The multi-GPU runs of one host (docs/PARALLEL.md, "Running on several GPUs"), unattended, one summary table
# at the end (each line: PASS / FAIL / MISSING / SKIP / INFO, what, result, the command):
#   tools/gpu-multi.sh N            N = the GPUs of the host: 2, 4 or 8 (nvidia-h200-x2 / -x4 / -x8)
#   DEVICE=cpu MODEL_ARGS=default tools/gpu-multi.sh 2
#                                   the dry run without GPUs (.ci/run): the same parity and fault logic on CPU
#                                   ranks of the embedded model (default: the tiny preset; MODEL_ARGS='--preset
#                                   mini' for 4 and 8 ranks). CPU ranks are threads of one process; the
#                                   multi-process launch is refused on the CPU, and the fault step checks that
#                                   refusal with the same launcher, bounds and assertions
# Steps, in the order of STEPS (default parity,faults,comm,bench; each command bounded by `timeout`, the whole
# run by DEADLINE, default 560 s; budgets on x8):
#   parity (~240 s): a 4-layer full-width K3 slice (k3-slice's widths, vocabulary 32768, synthesized once
#          into $SCRATCH by build/synth_config) at --tp 1 against one process per GPU (CUDA_VISIBLE_DEVICES=R,
#          --world-size N --rank R --rendezvous FILE) for each layout of the kind (x2: tp 2, pp 2; x4: tp 4,
#          dp 2 + ep, tp 2 x pp 2, the hybrid tp 2 x dp 2 + ep; x8: tp 8, dp 8 + ep, tp 4 x pp 2, the hybrid
#          tp 4 x dp 2 + ep): `k3c logits` bf16 within the tests' bound (no farther from the f32
#          function than 2x world size 1's own bf16 logits) and --f32 within 1e-5; `k3c generate` greedy 256
#          steps identical, the default path (specialized at tp 1) and --stock; `k3c run --spec 3` (verify
#          steps) identical; rank 0 removed the rendezvous file; every step of every multi-rank run checks
#          the ranks' logits bitwise against rank 0's (K3C_CHECK_RANKS=1);
#   comm (~120 s): build/bench_comm, one rank per GPU, mailbox one-shot / two-shot vs NCCL, 1 KB .. 4 MB,
#          eager and graph, ranks 2 and N; the table of us per call and the crossover lines;
#   bench (the rest, ~110 s): `k3c bench --device cuda` --tp N on k3-tp8-rank and k3-slice, batch 1-64, q 1 and 4
#          (step, floor, fraction of floor: a rank's share), each rank generating its shard of the weights on
#          its GPU; kimi-linear-48b at tp 2 against tp 1; DEP (dp N + ep, STEP rows) on x8;
#          what the commands refuse is a MISSING line with their message, and the tp 1 rows that run today
#          (k3-tp8-rank: one TP 8 rank's share without its collectives) are measured instead;
#   faults (~90 s): the last rank killed (SIGKILL) mid-generate: every other rank exits non-zero with a
#          message within --rank-timeout + 15 s (no hang); a rank with another --max-context refused at the
#          start-up check on every rank; a rank alone timing out at the rendezvous.
# Never changes GPU settings; NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Logs under $OUT (default
# /tmp/k3c-gpu-multi), the slice under $SCRATCH (default $TMPDIR or /tmp; ~10 GB, removed at the end unless
# KEEP=1). Exit 0 when no line is FAIL. Needs build/k3c (and build/bench_comm, build/synth_config: make -j
# build/k3c build/bench_comm build/synth_config) and python3 (tools/logits_cmp.py, standard library only).
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:-2}
DEVICE=${DEVICE:-cuda}
K3C=${K3C:-build/k3c}
OUT=${OUT:-/tmp/k3c-gpu-multi}
SCRATCH=${SCRATCH:-${TMPDIR:-/tmp}/k3c-gpu-multi-scratch}
STEPS=${STEPS:-parity,faults,comm,bench}
GEN_N=${GEN_N:-256}
export NCCL_NVLS_ENABLE=0
# every step of a multi-rank run: each rank's logits hash compared with rank 0's (a difference fails the
# command, naming the rank and step)
export K3C_CHECK_RANKS=1
MULTI_OK=0
case "$N" in 2 | 4 | 8) ;; *) echo "usage: tools/gpu-multi.sh 2|4|8 (the GPUs of the host)"; exit 2 ;; esac
case "$DEVICE" in cpu | cuda) ;; *) echo "DEVICE=$DEVICE: cpu or cuda"; exit 2 ;; esac
mkdir -p "$OUT" && rm -rf "${OUT:?}"/multi && mkdir -p "$OUT/multi"
L="$OUT/multi"
SUMMARY="$L/summary.txt"
: >"$SUMMARY"
T_START=$(date +%s)
# the whole run stays under DEADLINE s (default 560: one 10-minute call with room for the summary); every
# command's limit is cut to what is left, a step that starts with under 20 s left is skipped
DEADLINE=${DEADLINE:-560}
left() { local l=$((DEADLINE - ($(date +%s) - T_START))); echo $((l > 1 ? l : 1)); }
cap() { local l; l=$(left); echo $(($1 < l ? $1 : l)); }

# one summary line: STATUS, what, result, command
line() { printf '%-7s | %-34s | %s | %s\n' "$1" "$2" "$3" "$4" >>"$SUMMARY"; }
has_step() {
    [[ ",$STEPS," == *",$1,"* ]] || return 1
    [ "$(left)" -ge 20 ] && return 0
    line SKIP "step $1" "out of time: $(left) s left of DEADLINE $DEADLINE s" "-"
    return 1
}
# a log's message: its last line of k3c's own (`k3c CMD: ...`; NCCL's WARN lines or a usage may follow), else its
# last line
lastmsg() {
    local m
    m=$(grep -E '^k3c [a-z]+: ' "$1" 2>/dev/null | grep -v ': reserved ' | tail -1)
    [ -n "$m" ] || m=$(grep -v '^$' "$1" 2>/dev/null | tail -1)
    echo "${m:0:200}"
}

# The model: the slice on cuda, the tiny preset on the dry run (MODEL_ARGS overrides either)
if [ "${MODEL_ARGS:-}" = default ]; then
    MODEL=() # the embedded model (k3-fortune): trained, so its greedy bf16 streams have no near-ties
elif [ -n "${MODEL_ARGS:-}" ]; then
    read -r -a MODEL <<<"$MODEL_ARGS"
elif [ "$DEVICE" = cpu ]; then
    MODEL=(--preset tiny)
else
    SLICE="$SCRATCH/k3slice4"
    MODEL=(--model "$SLICE")
fi
DEV=(--device "$DEVICE")
RANK_TIMEOUT=${RANK_TIMEOUT:-30}

# ranks NAME LIMIT_S W ARGS...: the command on W ranks. cuda: one process per GPU (CUDA_VISIBLE_DEVICES=R,
# --world-size W --rank R --rendezvous), all started at once, each under `timeout LIMIT_S`; cpu: CPU ranks in
# one process (the args as given). W = 1: one process alone. Sets RC (every rank's exit, space-separated),
# RC0 (rank 0's), CMD (the command as the summary shows it); rank 0's stdout is $L/NAME.out.
ranks() {
    local name=$1 limit w=$3
    limit=$(cap "$2")
    shift 3
    local pids=() r
    RC="" RC0=""
    if [ "$DEVICE" = cpu ] || [ "$w" = 1 ]; then
        CMD="$K3C $*"
        [ "$DEVICE" = cuda ] && CMD="CUDA_VISIBLE_DEVICES=0 $CMD"
        CUDA_VISIBLE_DEVICES=0 timeout "$limit" "$K3C" "$@" >"$L/$name.out" 2>"$L/$name.err"
        RC0=$?
        RC=$RC0
        [ "$RC0" = 0 ] && [ "$w" -gt 1 ] && MULTI_OK=$((MULTI_OK + 1))
        return
    fi
    local rdv="$L/$name.rdv"
    rm -f "$rdv"*
    CMD="CUDA_VISIBLE_DEVICES=R $K3C $* --world-size $w --rank R --rendezvous $rdv  (R = 0..$((w - 1)))"
    for ((r = 0; r < w; r++)); do
        CUDA_VISIBLE_DEVICES=$r timeout "$limit" "$K3C" "$@" --world-size "$w" --rank "$r" --rendezvous "$rdv" \
            --rank-timeout "$RANK_TIMEOUT" >"$L/$name.r$r.out" 2>"$L/$name.r$r.err" &
        pids+=($!)
    done
    for ((r = 0; r < w; r++)); do
        wait "${pids[$r]}" 2>/dev/null
        RC="$RC $?"
    done
    RC=${RC# }
    RC0=${RC%% *}
    ranks_ok && MULTI_OK=$((MULTI_OK + 1))
    cp "$L/$name.r0.out" "$L/$name.out"
    cp "$L/$name.r0.err" "$L/$name.err"
    if [ -e "$rdv" ]; then RC0=99 && echo "k3c gpu-multi: rank 0 left the rendezvous file $rdv behind" >>"$L/$name.err"; fi
}

# the ranks' exits as one word: "ok" when all 0, else the list; hung = a rank stopped by timeout
ranks_ok() { [ -z "$(echo "$RC" | tr ' ' '\n' | grep -v '^0$')" ]; }
hung() { echo "$RC" | tr ' ' '\n' | grep -qE '^(124|137)$'; }

# the status of a bf16 result that differs from tp 1: a FAIL on the GPUs (issue 22 asks them equal); on CPU
# ranks INFO, as the CPU tests expect (their TP sums the shards in another order than world size 1)
BF16_BAD=FAIL
[ "$DEVICE" = cpu ] && BF16_BAD=INFO

# refused CHECK: a MISSING line when the command refused the layout as not wired yet, a FAIL otherwise
refused() {
    local what=$1 name=$2 msg
    msg=$(grep -h -m1 -E 'not wired|refused for now|only, not with|no tensor-parallel|not supported' "$L/$name"*.err 2>/dev/null)
    if [ -n "$msg" ]; then line MISSING "$what" "refused: ${msg:0:200}" "$CMD"
    elif hung; then line FAIL "$what" "a rank hung (exits $RC)" "$CMD"
    else line FAIL "$what" "exits $RC: $(lastmsg "$L/$name.err")" "$CMD"; fi
}

# ---- the slice (cuda): 4 layers at K3's widths (dense layer 0, two MoE KDA layers, the MoE MLA layer 3),
# vocabulary 32768, as tests/gpu/test_gpu_tp.c synthesizes it
make_slice() {
    [ -n "${SLICE:-}" ] || return 0
    [ -f "$SLICE.done" ] && return 0
    [ -n "${SLICE_FAILED:-}" ] && return 1
    SLICE_FAILED=1
    local synth=${SYNTH:-build/synth_config}
    [ -x "$synth" ] || make -s "$synth" >"$L/synth-build.log" 2>&1
    rm -rf "$SLICE" && mkdir -p "$SCRATCH"
    local t0=$SECONDS
    timeout "$(cap 240)" "$synth" preset:k3-slice 7 "$SLICE" 4 32768 >"$L/synth.log" 2>&1
    local rc=$?
    [ $rc = 0 ] && touch "$SLICE.done"
    line "$([ $rc = 0 ] && echo INFO || echo FAIL)" "slice synthesized" "exit $rc in $((SECONDS - t0)) s, $(du -sh "$SLICE" 2>/dev/null | cut -f1)" \
        "$synth preset:k3-slice 7 $SLICE 4 32768"
    return $rc
}

# ---- 1. parity
PROMPT=1,2,3,4,5,6,7,8,9,10,11,12
PREFILL=8
ROWS=12
SPEC_PROMPTS='1,2,3,4,1,2,3,4,1,2,3;5,6,7,5,6,7,5,6'

# logits_check WHAT A B [BOUND]: rel of A against B (the f32 reference) within BOUND, or the 2x rule
logits_rel() { python3 tools/logits_cmp.py "$1" "$2" "$ROWS" 2>&1; }

parity_ref() { # the tp 1 runs every layout is compared with
    ranks ref-logits 180 1 logits "${MODEL[@]}" "${DEV[@]}" --prompt-ids $PROMPT --prefill $PREFILL --out "$L/ref.bf16.f32"
    REF_OK=$RC0 REF_CMD=$CMD
    [ "$RC0" = 0 ] || line FAIL "tp 1 logits bf16" "exit $RC0: $(lastmsg "$L/ref-logits.err")" "$CMD"
    ranks ref-logits-f32 180 1 logits "${MODEL[@]}" "${DEV[@]}" --prompt-ids $PROMPT --prefill $PREFILL --f32 --out "$L/ref.f32.f32"
    REF32_OK=$RC0
    if [ "$RC0" = 0 ] && [ "$REF_OK" = 0 ]; then
        REF_SELF=$(logits_rel "$L/ref.bf16.f32" "$L/ref.f32.f32")
        line INFO "tp 1 bf16 vs its f32 function" "$REF_SELF" "$REF_CMD [--f32]"
    elif [ "$RC0" != 0 ]; then
        line SKIP "tp 1 logits --f32" "exit $RC0: $(lastmsg "$L/ref-logits-f32.err")" "$CMD"
    fi
    ranks ref-gen 180 1 generate "${MODEL[@]}" "${DEV[@]}" --prompt-ids 1,2,3,4 -n "$GEN_N" --ignore-eos
    [ "$RC0" = 0 ] || line FAIL "tp 1 generate" "exit $RC0: $(lastmsg "$L/ref-gen.err")" "$CMD"
    ranks ref-gen-stock 180 1 generate "${MODEL[@]}" "${DEV[@]}" --prompt-ids 1,2,3,4 -n "$GEN_N" --ignore-eos --stock
    [ "$RC0" = 0 ] || line FAIL "tp 1 generate --stock" "exit $RC0: $(lastmsg "$L/ref-gen-stock.err")" "$CMD"
    if cmp -s "$L/ref-gen.out" "$L/ref-gen-stock.out"; then
        line INFO "tp 1 default path = --stock" "$GEN_N tokens equal ($(grep -m1 -oE '[0-9]+ steps: [0-9]+ specialized[^;]*, stock [0-9]+' "$L/ref-gen.err"))" "$CMD"
    else
        line INFO "tp 1 default path vs --stock" "differ from token $(first_diff "$L/ref-gen.out" "$L/ref-gen-stock.out")" "$CMD"
    fi
    ranks ref-gen-f32 180 1 generate "${MODEL[@]}" "${DEV[@]}" --prompt-ids 1,2,3,4 -n "$GEN_N" --ignore-eos --exact-f32
    REFG32_OK=$RC0
    [ "$RC0" = 0 ] || line SKIP "tp 1 generate --exact-f32" "exit $RC0: $(lastmsg "$L/ref-gen-f32.err")" "$CMD"
    ranks ref-spec 180 1 run "${MODEL[@]}" "${DEV[@]}" --prompts "$SPEC_PROMPTS" -n 64 --spec 3
    [ "$RC0" = 0 ] || line FAIL "tp 1 run --spec 3" "exit $RC0: $(lastmsg "$L/ref-spec.err")" "$CMD"
}

# first_diff A B: the index of the first token where two id streams differ
first_diff() {
    paste <(tr -s ' \n' '\n\n' <"$1" | grep -v '^$') <(tr -s ' \n' '\n\n' <"$2" | grep -v '^$') |
        awk -F'\t' '$1 != $2 { print NR - 1; found = 1; exit } END { if (!found) print "none (lengths differ?)" }'
}

# parity_layout TAG W LAYOUT...: every parity check of one layout against the tp 1 runs
parity_layout() {
    local tag=$1 w=$2
    shift 2
    local lay=("$@") what="${*}"
    ranks "$tag-logits" 240 "$w" logits "${MODEL[@]}" "${DEV[@]}" "${lay[@]}" --prompt-ids $PROMPT --prefill $PREFILL \
        --out "$L/$tag.bf16.f32"
    if [ "$RC0" != 0 ] || ! ranks_ok; then refused "$what logits bf16" "$tag-logits"; return; fi
    if [ "$REF_OK" = 0 ] && [ "$REF32_OK" = 0 ]; then
        local d r s bound
        d=$(logits_rel "$L/$tag.bf16.f32" "$L/ref.f32.f32")
        r=$(logits_rel "$L/$tag.bf16.f32" "$L/ref.bf16.f32")
        s=$(echo "$REF_SELF" | awk '{print $2}')
        bound=$(awk -v s="$s" 'BEGIN { printf "%.3e", 2 * s }')
        if awk -v d="$(echo "$d" | awk '{print $2}')" -v b="$bound" 'BEGIN { exit !(d == d + 0 && d <= b) }'; then
            line PASS "$what logits bf16" "vs f32: ${d%% bitwise*} <= $bound (2x tp 1's); vs tp 1 bf16: $r" "$CMD"
        else
            line $BF16_BAD "$what logits bf16" "vs f32: $d, bound $bound (2x tp 1's); vs tp 1 bf16: $r" "$CMD"
        fi
    elif [ "$REF_OK" = 0 ]; then
        line INFO "$what logits bf16" "vs tp 1 bf16: $(logits_rel "$L/$tag.bf16.f32" "$L/ref.bf16.f32") (no f32 reference)" "$CMD"
    fi
    if [ "$REF32_OK" = 0 ]; then
        ranks "$tag-logits-f32" 240 "$w" logits "${MODEL[@]}" "${DEV[@]}" "${lay[@]}" --prompt-ids $PROMPT \
            --prefill $PREFILL --f32 --out "$L/$tag.f32.f32"
        if [ "$RC0" = 0 ] && ranks_ok; then
            local f
            f=$(logits_rel "$L/$tag.f32.f32" "$L/ref.f32.f32")
            if awk -v d="$(echo "$f" | awk '{print $2}')" 'BEGIN { exit !(d == d + 0 && d <= 1e-5) }'; then
                line PASS "$what logits --f32" "vs tp 1 --f32: $f <= 1e-5" "$CMD"
            else line FAIL "$what logits --f32" "vs tp 1 --f32: $f, bound 1e-5" "$CMD"; fi
        else refused "$what logits --f32" "$tag-logits-f32"; fi
    fi
    local v ref path
    for v in default stock; do
        local extra=() refs=(ref-gen ref-gen-stock)
        [ "$v" = stock ] && extra=(--stock) refs=(ref-gen-stock)
        ranks "$tag-gen-$v" 300 "$w" generate "${MODEL[@]}" "${DEV[@]}" "${lay[@]}" --prompt-ids 1,2,3,4 -n "$GEN_N" \
            --ignore-eos "${extra[@]}"
        if [ "$RC0" != 0 ] || ! ranks_ok; then refused "$what generate $v" "$tag-gen-$v"; continue; fi
        path=$(grep -m1 -oE '[0-9]+ steps: [0-9]+ specialized[^;]*, stock [0-9]+' "$L/$tag-gen-$v.err")
        if [ "$v" = default ] && [ "$DEVICE" = cuda ] && [[ "$path" =~ ^[0-9]+\ steps:\ 0\ specialized ]]; then
            line MISSING "$what specialized path" "the default path ran every step stock ($path): the executor does not run this layout yet" "$CMD"
        fi
        for ref in "${refs[@]}"; do
            local rv=default
            [ "$ref" = ref-gen-stock ] && rv=stock
            if cmp -s "$L/$tag-gen-$v.out" "$L/$ref.out"; then
                line PASS "$what generate $v = tp 1 $rv" "$GEN_N greedy tokens equal${path:+ ($path)}" "$CMD"
            else
                line $BF16_BAD "$what generate $v = tp 1 $rv" "first difference at token $(first_diff "$L/$tag-gen-$v.out" "$L/$ref.out")${path:+ ($path)}" "$CMD"
            fi
        done
    done
    if [ "$REFG32_OK" = 0 ]; then
        ranks "$tag-gen-f32" 300 "$w" generate "${MODEL[@]}" "${DEV[@]}" "${lay[@]}" --prompt-ids 1,2,3,4 -n "$GEN_N" \
            --ignore-eos --exact-f32
        if [ "$RC0" != 0 ] || ! ranks_ok; then refused "$what generate --exact-f32" "$tag-gen-f32"
        elif cmp -s "$L/$tag-gen-f32.out" "$L/ref-gen-f32.out"; then
            line PASS "$what generate --exact-f32 = tp 1" "$GEN_N greedy tokens equal" "$CMD"
        else
            line FAIL "$what generate --exact-f32 = tp 1" "first difference at token $(first_diff "$L/$tag-gen-f32.out" "$L/ref-gen-f32.out")" "$CMD"
        fi
    fi
    ranks "$tag-spec" 300 "$w" run "${MODEL[@]}" "${DEV[@]}" "${lay[@]}" --prompts "$SPEC_PROMPTS" -n 64 --spec 3
    if [ "$RC0" != 0 ] || ! ranks_ok; then refused "$what run --spec 3" "$tag-spec"; return; fi
    local drafts
    drafts=$(grep -m1 -oE 'accepted [0-9]+ / proposed [0-9]+' "$L/$tag-spec.err")
    if cmp -s "$L/$tag-spec.out" "$L/ref-spec.out"; then
        line PASS "$what run --spec 3 = tp 1" "2 x 64 tokens equal (drafts $drafts)" "$CMD"
    else
        line $BF16_BAD "$what run --spec 3 = tp 1" "outputs differ (drafts $drafts; diff $L/$tag-spec.out $L/ref-spec.out)" "$CMD"
    fi
}

step_parity() {
    local t0=$SECONDS
    make_slice || return
    parity_ref
    # PP, DEP and the hybrid: one process per GPU too (the logits hand-off staged through device buffers)
    case "$N" in
        2) parity_layout tp2 2 --tp 2; parity_layout pp2 2 --pp 2 ;;
        4) parity_layout tp4 4 --tp 4; parity_layout dp2ep 2 --dp 2 --ep; parity_layout tp2pp2 4 --tp 2 --pp 2
           parity_layout hybrid4 4 --tp 2 --dp 2 --ep ;;
        8) parity_layout tp8 8 --tp 8; parity_layout dp8ep 8 --dp 8 --ep; parity_layout tp4pp2 8 --tp 4 --pp 2
           parity_layout hybrid8 8 --tp 4 --dp 2 --ep ;;
    esac
    [ "$DEVICE" = cpu ] && [ "$N" = 2 ] && parity_layout dp2ep 2 --dp 2 --ep # DEP on CPU ranks (one process)
    local differ
    differ=$(grep -l "logits differ from rank 0" "$L"/*.err 2>/dev/null | wc -l)
    if [ "$differ" = 0 ] && [ "$MULTI_OK" -gt 0 ]; then
        line PASS "ranks bitwise equal" "$MULTI_OK multi-rank runs: every step, every rank's logits hash = rank 0's (K3C_CHECK_RANKS=1)" "-"
    elif [ "$differ" != 0 ]; then
        line FAIL "ranks bitwise equal" "$differ runs stopped at a rank whose logits differ: $(grep -h -m1 'logits differ' "$L"/*.err | head -1)" "-"
    else
        line SKIP "ranks bitwise equal" "no multi-rank run succeeded" "-"
    fi
    line INFO "parity step time" "$((SECONDS - t0)) s (budget 240 s on x8)" "-"
}

# ---- 2. all-reduce latency
comm_table() {
    awk '$1 == "COMM" && $7 > 1 { print $5, $9, $2 "-" $3 "-" $8, $10 }' "$1" | sort -k1,1n -k2,2n |
        awk 'BEGIN { n = split("mailbox-one-shot-eager mailbox-two-shot-eager nccl-nccl-eager mailbox-one-shot-graph " \
                               "mailbox-two-shot-graph nccl-nccl-graph", c, " ");
                     printf "%5s %8s", "ranks", "bytes"; for (i = 1; i <= n; i++) { h = c[i]; sub("nccl-nccl", "nccl", h); printf " %22s", h }
                     printf "\n" }
             function flush() { if (key == "") return; split(key, p, " "); printf "%5d %8d", p[1], p[2];
                                for (i = 1; i <= n; i++) printf " %22s", (c[i] in us) ? us[c[i]] : "-"; printf "\n";
                                for (i = 1; i <= n; i++) delete us[c[i]] }
             { k = $1 " " $2; if (k != key) { flush(); key = k } us[$3] = $4 }
             END { flush() }'
}

step_comm() {
    local t0=$SECONDS
    if [ "$DEVICE" = cpu ]; then line SKIP "all-reduce latency" "build/bench_comm needs CUDA" "-"; return; fi
    local rl=2
    [ "$N" -gt 2 ] && rl=2,$N
    local cmd=(build/bench_comm --ranks "$rl" --iters "${COMM_ITERS:-200}")
    timeout "$(cap 120)" env NCCL_NVLS_ENABLE=0 "${cmd[@]}" >"$L/comm.out" 2>"$L/comm.err"
    local rc=$?
    local c="NCCL_NVLS_ENABLE=0 ${cmd[*]}"
    if [ $rc != 0 ]; then line FAIL "all-reduce latency" "exit $rc: $(lastmsg "$L/comm.err")" "$c"; fi
    # COMM <impl> <algo> ranks <R> gpus <G> <eager|graph> <bytes> <us>: a row per (ranks, bytes) of the rows with
    # one rank per GPU, a column per (impl, algo, mode); plain awk and sort (no gawk on every host)
    comm_table "$L/comm.out" >"$L/comm-table.txt"
    if [ -s "$L/comm-table.txt" ]; then
        line "$([ $rc = 0 ] && echo PASS || echo FAIL)" "all-reduce latency (us per call)" "table: $L/comm-table.txt (below)" "$c"
    else
        line FAIL "all-reduce latency" "no COMM rows with several GPUs (see $L/comm.out)" "$c"
    fi
    grep '^CROSSOVER' "$L/comm.out" | while read -r x; do line INFO "crossover" "$x" "$c"; done
    # the goal: a decode-sized all-reduce (7-14 KB, 8 ranks) at or under 5 us in a graph
    awk '$1 == "COMM" && $5 == 8 && $7 > 1 && $8 == "graph" && ($9 == 7168 || $9 == 14336) { printf "%s %s %d B %s us; ", $2, $3, $9, $10 }' \
        "$L/comm.out" >"$L/comm-goal.txt"
    [ -s "$L/comm-goal.txt" ] && line INFO "8 ranks, graph, decode sizes (goal <= 5 us)" "$(cat "$L/comm-goal.txt")" "$c"
    line INFO "comm step time" "$((SECONDS - t0)) s (budget 120 s)" "-"
}

# ---- 3. decode steps
# bench_rows NAME LIMIT WHAT ARGS...: a tp 1 bench on GPU 0, its STEP / SPEC lines kept
bench_rows() {
    local name=$1 limit=$2 what=$3
    shift 3
    ranks "$name" "$limit" 1 bench "$@"
    grep -E '^(STEP|stock|spec|SPEC|RATIO)' "$L/$name.out" >"$L/$name.rows"
    if [ "$RC0" = 0 ]; then
        line PASS "$what" "$(grep -c . "$L/$name.rows") rows: $L/$name.rows (step_ms floor_ms of_floor)" "$CMD"
    elif [ "$RC0" = 124 ] && [ "$(left)" -le 2 ]; then
        line SKIP "$what" "cut by DEADLINE after $(grep -c . "$L/$name.rows") rows (kept in $L/$name.rows)" "$CMD"
    else
        line FAIL "$what" "exit $RC0: $(lastmsg "$L/$name.err")" "$CMD"
    fi
}

step_bench() {
    local t0=$SECONDS B=(--batches 1,2,4,8,16,32,64 --verify 1,4 --steps "${BENCH_STEPS:-10}")
    if [ "$DEVICE" = cpu ]; then
        ranks bench-cpu 60 1 bench --device cpu --preset tiny --tp "$N" --steps 8 --prefill 0 --runs 1
        [ "$RC0" = 0 ] && line PASS "cpu bench tp $N (dry run)" "$(grep -m1 -i 'decode' "$L/bench-cpu.out" | cut -c1-100)" "$CMD" ||
            line FAIL "cpu bench tp $N (dry run)" "exit $RC0: $(lastmsg "$L/bench-cpu.err")" "$CMD"
        return
    fi
    local p
    for p in k3-tp8-rank k3-slice; do
        ranks "bench-$p-tp$N" 240 "$N" bench --device cuda --preset $p --tp "$N" "${B[@]}"
        [ "$RC0" = 0 ] && ranks_ok && line PASS "bench $p --tp $N" "see $L/bench-$p-tp$N.out" "$CMD" ||
            refused "bench $p --tp $N" "bench-$p-tp$N"
    done
    ranks bench-kl48-tp2 240 2 bench --device cuda --preset kimi-linear-48b --tp 2 "${B[@]}"
    [ "$RC0" = 0 ] && ranks_ok && line PASS "bench kimi-linear-48b --tp 2" "see $L/bench-kl48-tp2.out" "$CMD" ||
        refused "bench kimi-linear-48b --tp 2" bench-kl48-tp2
    if [ "$N" = 8 ]; then
        ranks bench-dep8 240 8 bench --device cuda --preset k3-tp8-rank --dp 8 --ep --batches 64 --steps 10
        [ "$RC0" = 0 ] && ranks_ok && line PASS "bench DEP dp 8 + ep" "see $L/bench-dep8.out" "$CMD" ||
            refused "bench DEP dp 8 + ep" bench-dep8
    fi
    # what runs today: one TP 8 rank's share of every layer (no collectives), and kimi-linear-48b's tp 1 step
    bench_rows bench-k3-tp8-rank-tp1 150 "bench k3-tp8-rank tp 1 (a rank's share)" --device cuda --preset k3-tp8-rank "${B[@]}"
    bench_rows bench-kl48-tp1 150 "bench kimi-linear-48b tp 1" --device cuda --preset kimi-linear-48b "${B[@]}"
    line INFO "bench step time" "$((SECONDS - t0)) s (budget: what DEADLINE leaves, ~110 s)" "-"
}

# ---- 4. faults
step_faults() {
    make_slice || return
    local t0=$SECONDS w=$N
    [ "$DEVICE" = cpu ] && w=2
    local lay=(--tp "$w") args=("${MODEL[@]}" "${DEV[@]}") rdv="$L/kill.rdv" pids=() r
    # 1. the last rank killed mid-run: a long generate, killed once rank 0 has printed tokens
    rm -f "$rdv"*
    local gen=(generate "${args[@]}" "${lay[@]}" --prompt-ids 1,2,3,4 -n 4000 --ignore-eos --max-context 4100)
    local cmd="CUDA_VISIBLE_DEVICES=R $K3C ${gen[*]} --world-size $w --rank R --rendezvous $rdv --rank-timeout 20; kill -9 rank $((w - 1))"
    # the last rank runs without `timeout`, so that its pid is k3c's own (killing a `timeout` would leave its
    # child running); it is killed here in every case
    for ((r = 0; r < w - 1; r++)); do
        CUDA_VISIBLE_DEVICES=$r timeout "$(cap 120)" "$K3C" "${gen[@]}" --world-size "$w" --rank "$r" --rendezvous "$rdv" \
            --rank-timeout 20 >"$L/kill.r$r.out" 2>"$L/kill.r$r.err" &
        pids+=($!)
    done
    CUDA_VISIBLE_DEVICES=$((w - 1)) "$K3C" "${gen[@]}" --world-size "$w" --rank $((w - 1)) --rendezvous "$rdv" \
        --rank-timeout 20 >"$L/kill.r$((w - 1)).out" 2>"$L/kill.r$((w - 1)).err" &
    pids+=($!)
    local k=0 started=0 kmax=$(($(cap 90) * 10))
    while [ $k -lt $kmax ]; do # up to 90 s for rank 0's first tokens
        if [ -s "$L/kill.r0.out" ]; then started=1 && break; fi
        kill -0 "${pids[0]}" 2>/dev/null || break
        sleep 0.1
        k=$((k + 1))
    done
    [ $started = 1 ] && sleep 1
    local tk=$SECONDS
    kill -9 "${pids[$((w - 1))]}" 2>/dev/null
    local bad="" times=""
    for ((r = 0; r < w; r++)); do
        wait "${pids[$r]}" 2>/dev/null
        local rc=$?
        times="$times r$r:exit $rc at +$((SECONDS - tk)) s;"
        [ $r = $((w - 1)) ] && [ $started = 1 ] && continue
        if [ $rc = 0 ]; then bad="$bad rank $r exited 0;"
        elif [ $rc = 124 ] || [ $rc = 137 ]; then bad="$bad rank $r hung (timeout);"
        elif [ -z "$(lastmsg "$L/kill.r$r.err")" ]; then bad="$bad rank $r exited $rc without a message;"; fi
    done
    local el=$((SECONDS - tk))
    if [ $started = 1 ]; then
        [ $el -gt 35 ] && bad="$bad the others took $el s (bound 20 + 15);"
        if [ -z "$bad" ]; then line PASS "fault: rank $((w - 1)) of $w killed" "$times rank 0: $(lastmsg "$L/kill.r0.err")" "$cmd"
        else line FAIL "fault: rank $((w - 1)) of $w killed" "$bad $times" "$cmd"; fi
    elif [ "$DEVICE" = cpu ] && [ -z "$bad" ] && grep -q 'one process per rank runs over NCCL' "$L/kill.r0.err"; then
        line PASS "fault launcher (dry run)" "every rank refused at once on cpu, none hung:$times" "$cmd"
    else
        line FAIL "fault: rank $((w - 1)) of $w killed" "rank 0 printed no token before it ended:$bad $times $(lastmsg "$L/kill.r0.err")" "$cmd"
    fi
    # 2. a mismatched configuration: the last rank with another --max-context
    rm -f "$L/mismatch.rdv"*
    pids=()
    local mm=(generate "${args[@]}" "${lay[@]}" --prompt-ids 1,2,3,4 -n 8)
    cmd="CUDA_VISIBLE_DEVICES=R $K3C ${mm[*]} --max-context 64 (rank $((w - 1)): 96) --world-size $w --rank R --rendezvous $L/mismatch.rdv"
    local t1=$SECONDS
    for ((r = 0; r < w; r++)); do
        local mc=64
        [ $r = $((w - 1)) ] && mc=96
        CUDA_VISIBLE_DEVICES=$r timeout "$(cap 120)" "$K3C" "${mm[@]}" --max-context $mc --world-size "$w" --rank "$r" \
            --rendezvous "$L/mismatch.rdv" --rank-timeout 20 >"$L/mismatch.r$r.out" 2>"$L/mismatch.r$r.err" &
        pids+=($!)
    done
    bad="" times=""
    local want='start-up check'
    [ "$DEVICE" = cpu ] && want='one process per rank runs over NCCL'
    for ((r = 0; r < w; r++)); do
        wait "${pids[$r]}" 2>/dev/null
        local rc=$?
        times="$times r$r:$rc;"
        [ $rc = 0 ] && bad="$bad rank $r started;"
        { [ $rc = 124 ] || [ $rc = 137 ]; } && bad="$bad rank $r hung;"
    done
    grep -q "$want" "$L/mismatch.r0.err" || bad="$bad rank 0 does not say '$want': $(lastmsg "$L/mismatch.r0.err");"
    if [ -z "$bad" ]; then line PASS "fault: mismatched --max-context" "refused in $((SECONDS - t1)) s, exits$times rank 0: $(lastmsg "$L/mismatch.r0.err")" "$cmd"
    else line FAIL "fault: mismatched --max-context" "$bad exits$times" "$cmd"; fi
    # 3. a rank alone: times out at the rendezvous, naming the file
    rm -f "$L/alone.rdv"*
    cmd="CUDA_VISIBLE_DEVICES=1 $K3C generate ${args[*]} ${lay[*]} --prompt-ids 1,2,3 -n 4 --world-size $w --rank 1 --rendezvous $L/alone.rdv --rank-timeout 5"
    t1=$SECONDS
    CUDA_VISIBLE_DEVICES=1 timeout "$(cap 60)" "$K3C" generate "${args[@]}" "${lay[@]}" --prompt-ids 1,2,3 -n 4 --world-size "$w" --rank 1 \
        --rendezvous "$L/alone.rdv" --rank-timeout 5 >"$L/alone.out" 2>"$L/alone.err"
    local rc=$?
    want='no usable record from rank 0'
    [ "$DEVICE" = cpu ] && want='one process per rank runs over NCCL'
    if [ $rc = 1 ] && grep -q "$want" "$L/alone.err"; then line PASS "fault: rank 1 alone at the rendezvous" "exit 1 in $((SECONDS - t1)) s: $(lastmsg "$L/alone.err")" "$cmd"
    else line FAIL "fault: rank 1 alone at the rendezvous" "exit $rc in $((SECONDS - t1)) s: $(lastmsg "$L/alone.err")" "$cmd"; fi
    line INFO "faults step time" "$((SECONDS - t0)) s (budget 90 s)" "-"
}

for st in ${STEPS//,/ }; do
    case "$st" in
        parity | comm | bench | faults) has_step "$st" && "step_$st" ;;
        *) line FAIL "STEPS" "'$st' is not parity, comm, bench or faults" "-" ;;
    esac
done
[ -n "${SLICE:-}" ] && [ "${KEEP:-0}" != 1 ] && rm -rf "$SLICE" "$SLICE.done"

echo "== tools/gpu-multi.sh $N: device $DEVICE, $(($(date +%s) - T_START)) s, logs in $L =="
printf '%-7s | %-34s | %s | %s\n' STATUS CHECK RESULT COMMAND
cat "$SUMMARY"
[ -s "$L/comm-table.txt" ] && echo "-- all-reduce, us per call ($L/comm-table.txt) --" && cat "$L/comm-table.txt"
for f in "$L"/bench-*.rows; do [ -s "$f" ] && echo "-- $(basename "$f" .rows) --" && cat "$f"; done
nf=$(grep -c '^FAIL' "$SUMMARY")
echo "gpu-multi: $(grep -c '^PASS' "$SUMMARY") passed, $nf failed, $(grep -c '^MISSING' "$SUMMARY") missing"
[ "$nf" = 0 ]
