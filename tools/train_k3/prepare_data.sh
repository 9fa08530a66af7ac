#!/bin/sh
# Prepares the training data of tools/train_k3 from Debian's fortune packages (no network needed once they are
# installed): tools/train_k3/prepare_data.sh --data DIR
# Then checks that DIR's held-out text and tokenizer equal the committed copies (tools/train_k3/data/heldout.txt,
# tools/train_k3/tokenizer/), so a fresh preparation reproduces what the model was trained and evaluated on.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
data=
while [ $# -gt 0 ]; do
    case "$1" in
        --data) data=$2; shift 2 ;;
        *) echo "usage: $0 --data DIR" >&2; exit 2 ;;
    esac
done
[ -n "$data" ] || { echo "usage: $0 --data DIR" >&2; exit 2; }
missing=
for p in fortunes fortunes-min fortunes-zh; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "missing Debian packages:$missing (apt-get install -y$missing)" >&2
    exit 1
fi
python3 "$here/prepare_data.py" --data "$data"
status=0
for f in data/heldout.txt:heldout.txt tokenizer/tiktoken.model:tokenizer/tiktoken.model \
         tokenizer/tokenizer_config.json:tokenizer/tokenizer_config.json; do
    committed=$here/${f%%:*} prepared=$data/${f#*:}
    if [ ! -f "$committed" ]; then
        echo "note: $committed is not committed yet"
    elif cmp -s "$committed" "$prepared"; then
        echo "ok: $prepared equals the committed $committed"
    else
        echo "DIFFERS: $prepared and the committed $committed" >&2
        status=1
    fi
done
exit $status
