#!/usr/bin/env bash
# k3c's CPU prefill and decode against llama.cpp's CPU backend on the same Kimi Linear weights (bf16 in
# both), THREADS threads each (docs/BENCHMARKS.md, "CPU: k3c against llama.cpp"); with MODELS naming K3
# models, the same logits check for Kimi K3 (llama.cpp's kimi-k3 model, src/models/kimi-k3.cpp and
# conversion/kimi_k3.py; the PyPI sdist below carries it).
#
#   LLAMA_DIR=/path/to/llama.cpp [PYTHON=venv/bin/python] bash tools/llama-cpu-compare.sh
#   LLAMA_DIR=... PYTHON=... MODELS="k3-tiny k3-tiny-bf16 k3-mini" CHECK_ONLY=1 bash tools/llama-cpu-compare.sh
#
# llama.cpp is not downloaded here (the machine this runs on may reach nothing). Its source, any revision
# with Kimi Linear (src/models/kimi-linear.cpp, conversion/kimi_linear.py):
#   - the repository github.com/ggml-org/llama.cpp (a clone), or
#   - the sdist of the PyPI package llama-cpp-python, which carries it under vendor/llama.cpp:
#     `pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36` (the tree measured on 2026-12-02).
# Build its CPU backend (Release, no GPU backend) with the tools llama-bench and llama-debug, outside this
# repository; LLAMA_BIN (default $LLAMA_DIR/build/bin) is where they are.
# PYTHON runs llama.cpp's convert_hf_to_gguf.py: it needs torch, numpy, safetensors and transformers (the
# converter's pin, 4.57.6, which does not know kimi_linear and so hands the converter config.json as written).
#
# What it does, in WORK (default /tmp/k3c-llama-cpu; about 2.7 GB for the default models):
#   1. builds k3c CPU-only in K3C_BUILD (default build-llama-cpu) and tools/synth_config.c beside it;
#   2. synthesizes each of MODELS (seed 1): kimi-linear-tiny (the preset, 4.9 M parameters) and
#      kimi-linear-mini (tools/llama-cpu/kimi-linear-mini.json: mini's dims in Kimi Linear's architecture,
#      bf16 experts, 451 M parameters); converts each to a bf16 GGUF (tools/llama-cpu/to_gguf.py);
#   3. checks that the engines agree on the model: parameter counts, the prompt's token ids (each engine's
#      own tokenizer) and the logits of the prompt's last row (llama-debug --save-logits against k3c logits,
#      bf16 and --f32), on the model and on the same weights with every expert routed (must agree there);
#   4. REPEATS rounds (default 3), alternating the engines: llama-bench -p PROMPTS -n GEN -t THREADS -r RUNS
#      and `k3c bench --device cpu --model DIR` (decode GEN steps, a prompt of each of PROMPTS, best of RUNS;
#      default 3), the load average before each; prints the best of every row as a table. GFLOP/s uses
#      one count for both engines: 2 flops per matrix weight a prompt token multiplies (k3c bench's).
# BENCH_ONLY=1 skips 2 and 3 (the checkpoints of an earlier run in WORK are measured again); CHECK_ONLY=1
# skips 4 (the agreement checks alone).
# K3 models (MODELS): k3-tiny and k3-mini (the presets tiny and mini: MLA + KDA + AttnRes + the latent MoE,
# MXFP4 experts, the published checkpoint format) and k3-tiny-bf16 (tools/llama-cpu/k3-tiny-bf16.json: tiny
# with bf16 experts). The converter reads k3c's K3 folder as published (to_gguf.py adds only the tokenizer)
# and repacks the MXFP4 experts into ggml's MXFP4 blocks, values unchanged. llama.cpp's MXFP4 products round
# the activations to Q8_0 blocks (ggml's vec_dot_type for MXFP4), which k3c does not, so each MXFP4 model is
# also checked as MODEL-deq: the same values as bf16 experts (tools/llama-cpu/dequant_mxfp4.py), which
# llama.cpp multiplies in bf16; k3c's logits on it must be those of the MXFP4 model (k3c's bf16 forward:
# bit for bit, checked here). The dense-routing model that must agree is MODEL-deq-dense there (the MXFP4
# one is shown). GGUF_TYPE=f32 writes the GGUFs in f32 (the same weights widened; MXFP4 experts stay MXFP4):
# llama.cpp's products then do not round the activations to bf16, which sets its logits against k3c's --f32
# forward with no rounding of either engine's choosing between them.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${LLAMA_DIR:?set LLAMA_DIR to a llama.cpp source tree with its CPU build, see the header of this script}"
LLAMA_BIN=${LLAMA_BIN:-$LLAMA_DIR/build/bin}
PYTHON=${PYTHON:-python3}
WORK=${WORK:-/tmp/k3c-llama-cpu}
B=${K3C_BUILD:-build-llama-cpu}
THREADS=${THREADS:-2}
REPEATS=${REPEATS:-3}
PROMPTS=${PROMPTS:-256,1024}
GEN=${GEN:-32}
RUNS=${RUNS:-3}
MODELS=${MODELS:-kimi-linear-tiny kimi-linear-mini}
GGUF_TYPE=${GGUF_TYPE:-bf16}
TEXT=${TEXT:-The quick brown fox jumps over the lazy dog, and then it runs back home to sleep.}

for t in llama-bench llama-debug; do
    [ -x "$LLAMA_BIN/$t" ] || { echo "llama-cpu-compare: no $LLAMA_BIN/$t (build llama.cpp's CPU backend first)" >&2; exit 2; }
done
[ -f "$LLAMA_DIR/convert_hf_to_gguf.py" ] || { echo "llama-cpu-compare: no $LLAMA_DIR/convert_hf_to_gguf.py" >&2; exit 2; }

echo "== building k3c (CPU only) in $B"
make -s NVCC= BUILD="$B" "$B/k3c" "$B/libk3c.a"
LIBS="-lcjson -lpcre2-8 -lm -pthread"
cc -O2 -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Iinclude -Isrc tools/synth_config.c "$B/libk3c.a" $LIBS \
    -o "$B/synth_config"
mkdir -p "$WORK"

for m in $MODELS; do
    dir=$WORK/$m
    if [ -n "${BENCH_ONLY:-}" ]; then
        [ -f "$WORK/$m.gguf" ] && [ -f "$WORK/$m.params" ] || { echo "llama-cpu-compare: BENCH_ONLY: no $m in $WORK" >&2; exit 2; }
        continue
    fi
    echo "== $m: synthesize (seed 1), convert to GGUF"
    variants="$m $m-dense" gate=$m-dense
    case $m in
    kimi-linear-mini) "$B/synth_config" tools/llama-cpu/kimi-linear-mini.json 1 "$dir" ;;
    k3-tiny-bf16) "$B/synth_config" tools/llama-cpu/k3-tiny-bf16.json 1 "$dir" >/dev/null ;;
    k3-tiny | k3-mini)
        "$B/k3c" synth --preset "${m#k3-}" --seed 1 --out "$dir" >/dev/null 2>&1
        rm -rf "$dir-deq"
        "$PYTHON" tools/llama-cpu/dequant_mxfp4.py "$dir" "$dir-deq"
        variants="$variants $m-deq $m-deq-dense" gate=$m-deq-dense ;;
    *) "$B/k3c" synth --preset "$m" --seed 1 --out "$dir" ;;
    esac

    echo "== $m: do the engines agree?"
    p_k3c=$("$B/k3c" inspect "$dir" | sed -n 's/^  total *\([0-9]*\).*/\1/p')
    echo "$p_k3c" >"$WORK/$m.params"
    echo "parameters: k3c inspect $p_k3c; llama.cpp's count (llama-bench model_n_params) is in the table at the end"
    # the same weights with every expert selected (only num_experts_per_token changes): routing near-ties of
    # random weights turn bf16 rounding into other experts (k3c's own bf16 and f32 forwards differ as much),
    # so the routed model's logits are shown, and the dense-routing ones must agree
    for v in $variants; do
        case $v in
        *-dense)
            rm -rf "$WORK/$v" && mkdir "$WORK/$v"
            for f in "$WORK/${v%-dense}"/*; do [ "${f##*/}" = config.json ] || ln -s "$f" "$WORK/$v/"; done
            python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); t = c.get("text_config", c)
t["num_experts_per_token"] = t["num_experts"]; json.dump(c, open(sys.argv[2], "w"), indent=2)' \
                "$WORK/${v%-dense}/config.json" "$WORK/$v/config.json" ;;
        esac
        "$PYTHON" tools/llama-cpu/to_gguf.py --llama-dir "$LLAMA_DIR" --model "$WORK/$v" --out "$WORK/$v.gguf" \
            --outtype "$GGUF_TYPE" >"$WORK/$v.convert.log" 2>&1 || { tail -20 "$WORK/$v.convert.log" >&2; exit 1; }
    done
    for v in $variants; do
        rm -rf "$WORK/$v.debug"
        "$LLAMA_BIN/llama-debug" -m "$WORK/$v.gguf" -p "$TEXT" -t "$THREADS" -c 512 --save-logits \
            --logits-output-dir "$WORK/$v.debug" >"$WORK/$v.debug.log" 2>&1 || { tail -20 "$WORK/$v.debug.log" >&2; exit 1; }
        ids_llama=$(sed -n 's/^token ids: //p' "$WORK/$v.debug/llamacpp-$v-prompt.txt" | tr -d ' ')
        n=$(echo "$ids_llama" | tr ',' '\n' | wc -l)
        if [ "$v" = "$m" ]; then
            ids_k3c=$("$B/k3c" tokenize --model "$dir" "$TEXT" | tr ' ' ',')
            if [ "$ids_llama" = "$ids_k3c" ]; then echo "prompt ids: the same $n ids from both tokenizers"
            else echo "prompt ids differ: llama.cpp $ids_llama, k3c $ids_k3c (the logits below use llama.cpp's)"; fi
        fi
        for mode in bf16 f32; do
            "$B/k3c" logits --model "$WORK/$v" --prompt-ids "$ids_llama" --prefill "$n" --threads "$THREADS" \
                $([ $mode = f32 ] && echo --f32) --out "$WORK/$v.k3c-$mode" >/dev/null 2>&1
        done
        echo "$v (top-$(sed -n 's/.*"num_experts_per_token": *\([0-9]*\).*/\1/p' "$WORK/$v/config.json") routing):"
        ok=0
        "$PYTHON" tools/llama-cpu/compare_logits.py "$WORK/$v.k3c-bf16" "$WORK/$v.debug/llamacpp-$v.bin" --tokens "$n" || ok=1
        "$PYTHON" tools/llama-cpu/compare_logits.py "$WORK/$v.k3c-f32" "$WORK/$v.debug/llamacpp-$v.bin" --tokens "$n" \
            --names "k3c --f32,llama.cpp" || ok=1
        "$PYTHON" tools/llama-cpu/compare_logits.py "$WORK/$v.k3c-bf16" "$WORK/$v.k3c-f32" --tokens "$n" \
            --names "k3c,k3c --f32" || true
        case $v in
        *-deq | *-deq-dense)
            # the MXFP4 model's values as bf16 experts: k3c's bf16 forward gives the same logits bit for bit
            src=${v/-deq/}
            if cmp -s "$WORK/$v.k3c-bf16" "$WORK/$src.k3c-bf16"; then echo "k3c: $v gives the logits of $src, bit for bit"
            else echo "llama-cpu-compare: k3c's logits on $v differ from those on $src" >&2; exit 1; fi
            "$PYTHON" tools/llama-cpu/compare_logits.py "$WORK/$src.debug/llamacpp-$src.bin" \
                "$WORK/$v.debug/llamacpp-$v.bin" --tokens 1 --names "llama.cpp MXFP4 experts ($src),llama.cpp $GGUF_TYPE experts ($v)" || true ;;
        esac
        if [ "$v" = "$gate" ] && [ $ok != 0 ]; then
            echo "llama-cpu-compare: $m: the engines disagree on the dense-routing model" >&2
            exit 1
        fi
    done
done

[ -n "${CHECK_ONLY:-}" ] && exit 0

for r in $(seq 1 "$REPEATS"); do
    for m in $MODELS; do
        echo "== round $r/$REPEATS, $m: llama.cpp (load average $(cut -d' ' -f1-3 /proc/loadavg))"
        "$LLAMA_BIN/llama-bench" -m "$WORK/$m.gguf" -p "$PROMPTS" -n "$GEN" -t "$THREADS" -r "$RUNS" -o json \
            >"$WORK/$m.llama.$r.json" 2>"$WORK/$m.llama.$r.log" || { tail -20 "$WORK/$m.llama.$r.log" >&2; exit 1; }
        echo "== round $r/$REPEATS, $m: k3c (load average $(cut -d' ' -f1-3 /proc/loadavg))"
        "$B/k3c" bench --device cpu --model "$WORK/$m" --threads "$THREADS" --prefill "$PROMPTS" --runs "$RUNS" \
            --steps "$GEN" 2>/dev/null | tee "$WORK/$m.k3c.$r.txt"
        echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
    done
done

python3 - "$WORK" "$REPEATS" "$RUNS" "$THREADS" "$PROMPTS" "$GEN" $MODELS <<'EOF'
import json, re, sys
work, repeats, runs, threads, prompts, gen = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
lens = [int(x) for x in prompts.split(",")]
print(f"\nbest of {repeats} rounds x {runs} runs, {threads} threads; GFLOP/s = tok/s x MFLOP/token (one count for both)")
print("| model | parameters (k3c / llama.cpp) | engine | " + " | ".join(f"prefill {n}: tok/s | GFLOP/s" for n in lens)
      + f" | decode {gen}: tok/s |")
print("|---|---|---|" + "---|---|" * len(lens) + "---|")
ratios = []
for m in sys.argv[7:]:
    best = {("k3c", n): 0.0 for n in lens + [0]}
    best.update({("llama", n): 0.0 for n in lens + [0]})
    mflop, p_llama = None, None
    for r in range(1, repeats + 1):
        for row in json.load(open(f"{work}/{m}.llama.{r}.json")):
            n = row["n_prompt"] if row["n_gen"] == 0 else 0
            best["llama", n] = max(best["llama", n], max(row["samples_ts"]))
            p_llama = row["model_n_params"]
        for line in open(f"{work}/{m}.k3c.{r}.txt"):
            if (g := re.search(r"([\d.]+) MFLOP/tok\b", line)) and mflop is None:
                mflop = float(g.group(1))
            if g := re.match(r"\S+\s+cpu\s+decode .*\(\s*([\d.]+) tok/s\)", line):
                best["k3c", 0] = max(best["k3c", 0], float(g.group(1)))
            if g := re.match(r"\S+\s+cpu\s+prefill\s+(\d+) tokens .*\(\s*([\d.]+) tok/s\)", line):
                best["k3c", int(g.group(1))] = max(best["k3c", int(g.group(1))], float(g.group(2)))
    p_k3c = int(open(f"{work}/{m}.params").read())
    for e, name in (("k3c", "k3c"), ("llama", "llama.cpp")):
        cells = " | ".join(f"{best[e, n]:.1f} | {best[e, n] * mflop / 1e3:.1f}" for n in lens)
        print(f"| {m} | {p_k3c / 1e6:.1f} M / {p_llama / 1e6:.1f} M | {name} | {cells} | {best[e, 0]:.1f} |")
    ratio = ", ".join(f"prefill {n} {best['k3c', n] / best['llama', n]:.2f}x" for n in lens)
    ratios.append(f"{m}: k3c / llama.cpp = {ratio}, decode {best['k3c', 0] / best['llama', 0]:.2f}x")
print("\n".join([""] + ratios))
EOF
