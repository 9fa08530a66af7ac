#!/usr/bin/env bash
# Prompt-lookup speculation on the embedded k3-fortune model (docs/BENCHMARKS.md): for each prompt below, its
# ids (`k3c tokenize --no-special`) through `k3c run -n N --spec D` (greedy), one prompt a run; prints a
# markdown row per prompt: drafts accepted / proposed, verifies, tokens per verify (the accepted drafts plus
# the verified token, per verify), and the engine steps of the run (the prompt's included) against the N a
# run without speculation takes. Extra arguments go to `k3c run` (e.g. --device cuda, --preset tiny).
#   tools/spec-acceptance.sh [--k3c path/to/k3c] [k3c run options ...]   (env D: drafts, default 4; N: 128)
set -euo pipefail
cd "$(dirname "$0")/.."
K3C=build/k3c
if [ "${1:-}" = --k3c ]; then K3C=$2; shift 2; fi
D=${D:-4}
N=${N:-128}
# the tokenizer of the model run: a --preset among the run options names it too
preset=()
args=("$@")
for ((i = 0; i + 1 < ${#args[@]}; i++)); do
    if [ "${args[i]}" = --preset ]; then preset=(--preset "${args[i + 1]}"); fi
done
prompts=(
    'The meaning of life is'
    'Q: Why did the programmer'
    '人生'
    '%\nYou will be married within a year.\n%\nYou will be'
    'A fool and his money are soon parted.\n\t\t-- '
    'for (i = 0; i < n; i++) {\n\ta[i] = b[i];\n}\nfor (i = 0; i < n; i++) {\n'
)
echo "| prompt | accepted / proposed | verifies | tokens per verify | steps (without speculation: $N) |"
echo "|---|---:|---:|---:|---:|"
for p in "${prompts[@]}"; do
    ids=$("$K3C" tokenize "${preset[@]}" --no-special "$(printf '%b' "$p")" | tr ' ' ',')
    err=$("$K3C" run --prompts "$ids" -n "$N" --spec "$D" "$@" 2>&1 >/dev/null)
    drafts=$(grep '^drafts:' <<<"$err" || true)
    steps=$(sed -n 's/^steps: \([0-9]*\) .*/\1/p' <<<"$err")
    acc=$(sed -n 's/^drafts: accepted \([0-9]*\) \/ proposed \([0-9]*\) (\([0-9.]*%\).*/\1 \/ \2 (\3)/p' <<<"$drafts")
    ver=$(sed -n 's/.*, \([0-9]*\) verifies, \([0-9.]*\) tokens per verify.*/\1 | \2/p' <<<"$drafts")
    [ -n "$ver" ] || ver="0 | -"
    echo "| \`$p\` | ${acc:-0 / 0} | $ver | $steps |"
done
