"""Developer tool: the hottest instructions of an Nsight Compute source page. Reads the CSV of
`ncu --import R.ncu-rep --page source --csv --print-source sass` and prints the rows with the
most warp-stall samples (and the samples per SASS opcode), so that the stalls of one kernel can
be read next to its code without the GUI. Columns are found by name; an unknown layout prints
its header instead. Also the samples and executed instructions of the kernel's parts in code
order: up to the producer's register release (USETMAXREG.DEALLOC: the consumers), from there to
the next EXIT (the producer), and after it (the out-of-line barrier retries of both).

    python3 tools/profile/ncu_source_top.py src.csv [--top 40]
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


def opcode(sass):
    """SASS text -> its opcode without modifiers or predicate ("@!P0 BRA 0x..." -> "BRA")."""
    words = sass.split()
    if not words:
        return "?"
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


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
        per_op[opcode(r[source])] += number(r[samples])
    # Stall reasons (columns stall_*, all samples), overall and for the opcodes with most samples.
    reasons = [i for i, c in enumerate(header) if c.startswith("stall_") and "Not Issued" not in c]
    per_reason, per_op_reason, executed = Counter(), {}, Counter()
    executed_col = next((i for i, c in enumerate(header) if c == "Instructions Executed"), None)
    for r in body:
        op = opcode(r[source])
        for i in reasons:
            per_reason[header[i]] += number(r[i])
            per_op_reason.setdefault(op, Counter())[header[i][6:]] += number(r[i])
        if executed_col is not None:
            executed[op] += number(r[executed_col])
    print("samples per opcode (top stall reasons):")
    for op, n in per_op.most_common(15):
        top = ", ".join(f"{k} {100 * v / total:.1f}" for k, v in per_op_reason.get(op, Counter()).most_common(3))
        print(f"  {100 * n / total:5.1f} %  {op:10s} {top}")
    if reasons:
        print("stall reasons:", ", ".join(f"{k[6:]} {100 * v / total:.1f} %" for k, v in per_reason.most_common(8)))
    if executed:
        all_executed = sum(executed.values()) or 1.0
        gmma = sum(n for op, n in executed.items() if op.endswith("GMMA"))
        print(f"executed instructions per warpgroup MMA: {all_executed / max(gmma, 1):.1f}; shares:",
              ", ".join(f"{op} {100 * n / all_executed:.1f} %" for op, n in executed.most_common(10)))
    parts, part = Counter(), "consumers"
    parts_executed = Counter()
    for r in body:
        if "USETMAXREG.DEALLOC" in r[source]:
            part = "producer"
        elif part == "producer" and opcode(r[source]) == "EXIT" and not r[source].lstrip().startswith("@"):
            part = "after the producer's EXIT"
        parts[part] += number(r[samples])
        if executed_col is not None:
            parts_executed[part] += number(r[executed_col])
    for name in ("consumers", "producer", "after the producer's EXIT"):
        print(f"{name}: {100 * parts[name] / total:.1f} % of samples, {parts_executed[name]:,.0f} instructions executed")
    print(f"top {args.top} rows:")
    for r in sorted(body, key=lambda r: -number(r[samples]))[: args.top]:
        print(f"  {100 * number(r[samples]) / total:5.2f} %  {r[0]:>14s} {r[source][:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
