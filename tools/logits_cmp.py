#!/usr/bin/env python3
"""Distance between two `k3c logits` files (float32 [rows, vocab], row-major), for tools/gpu-multi.sh.

    tools/logits_cmp.py A B ROWS   prints "rel WORST bitwise EQUAL": WORST the largest over rows of
                                   |A_r - B_r|_2 / |B_r|_2, EQUAL 1 when the files are the same bytes.
Exits 1 (printing why) on files of different or impossible sizes, or a NaN / inf anywhere: NaN never passes.
Standard library only (the GPU hosts need no numpy).
"""
import array
import math
import sys


def load(path, rows):
    with open(path, "rb") as f:
        raw = f.read()
    a = array.array("f")
    a.frombytes(raw[: len(raw) - len(raw) % 4])
    if len(raw) % 4 or rows <= 0 or len(a) % rows or not a:
        sys.exit(f"{path}: {len(raw)} bytes is not {rows} rows of float32")
    return raw, a


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: logits_cmp.py A B ROWS")
    rows = int(sys.argv[3])
    ra, a = load(sys.argv[1], rows)
    rb, b = load(sys.argv[2], rows)
    if len(a) != len(b):
        sys.exit(f"{sys.argv[1]} has {len(a)} floats, {sys.argv[2]} {len(b)}")
    v = len(a) // rows
    worst = 0.0
    for r in range(rows):
        num = den = 0.0
        for x, y in zip(a[r * v:(r + 1) * v], b[r * v:(r + 1) * v]):
            if not (math.isfinite(x) and math.isfinite(y)):
                print(f"row {r}: a value that is not finite ({x}, {y})")
                sys.exit(1)
            num += (x - y) * (x - y)
            den += y * y
        d = math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)
        worst = max(worst, d)
    print(f"rel {worst:.3e} bitwise {int(ra == rb)}")


if __name__ == "__main__":
    main()
