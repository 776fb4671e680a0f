"""Developer tool: the hottest instructions of an Nsight Compute source page. Reads the CSV of
`ncu --import R.ncu-rep --page source --csv --print-source sass` and prints the rows with the
most warp-stall samples (and the samples per SASS opcode), so that the stalls of one kernel can
be read next to its code without the GUI. Columns are found by name; an unknown layout prints
its header instead.

    python3 tools/ncu_source_top.py src.csv [--top 40]
"""
import argparse
import csv
import re
import sys
from collections import Counter


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    rows = list(csv.reader(open(args.csv, newline="")))
    head = next((i for i, r in enumerate(rows) if any(re.search(r"Source", c) for c in r) and len(r) > 3), None)
    if head is None:
        print("no header with a Source column; first rows:")
        for r in rows[:5]:
            print(r)
        return 1
    header = rows[head]
    source = next(i for i, c in enumerate(header) if re.search(r"Source", c))
    samples = next((i for i, c in enumerate(header) if re.search(r"Sampling.*\(All", c)), None)
    if samples is None:
        print("no stall-sampling column; header:", header)
        return 1
    body = [r for r in rows[head + 1:] if len(r) == len(header)]
    total = sum(number(r[samples]) for r in body) or 1.0
    print(f"{len(body)} rows, {total:.0f} samples in column {header[samples]!r}")
    per_op = Counter()
    for r in body:
        op = r[source].split()[0] if r[source].split() else "?"
        if op.startswith("@"):
            op = r[source].split()[1] if len(r[source].split()) > 1 else op
        per_op[op.split(".")[0]] += number(r[samples])
    print("samples per opcode:")
    for op, n in per_op.most_common(15):
        print(f"  {100 * n / total:5.1f} %  {op}")
    print(f"top {args.top} rows:")
    for r in sorted(body, key=lambda r: -number(r[samples]))[: args.top]:
        print(f"  {100 * number(r[samples]) / total:5.2f} %  {r[0][:12]:12s} {r[source][:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
