"""The baseline step's table (tools/gpu/run.sh): our kernels against a baseline build (an older
commit, or a variant wheel), point by point, from the CSVs of alternating benchmark runs under
$OUT/baseline-{old,new}-<round>/. Per point and direction: each version's median TFLOP/s over the
rounds, new / old, and each version's ratio to an anchor provider measured in the same process
(drift between processes shows there). Works on benchmark_attn.py's and benchmark_varlen.py's
CSVs: a point is every column but the provider and the measurements.

    python3 tools/gpu/baseline_grid.py OUT_DIR [--ours flash_attn_hopper] [--anchor sdpa-cudnn] [--tolerance 0.02]
"""
import argparse
import csv
import math
import statistics
from pathlib import Path

VALUES = ("fwd_tflops", "bwd_tflops")


def load(out: Path) -> tuple[dict, list[str]]:
    """({(version, round): {(point..., provider): {direction: tflops}}}, the point's column names)"""
    runs, columns = {}, []
    for folder in sorted(out.glob("baseline-*-*")):
        if not folder.is_dir():
            continue
        _, version, rnd = folder.name.split("-")
        for f in sorted(folder.glob("*.csv")):
            rows = runs.setdefault((version, int(rnd)), {})
            for r in csv.DictReader(f.open()):
                columns = [c for c in r if c != "provider" and c not in VALUES and not c.endswith(("_min", "_max"))
                           and c not in ("sm_mhz", "power_w")]
                point = tuple(r[c] for c in columns)
                rows[(*point, r["provider"])] = {v[:3]: float(r[v]) if r.get(v) else math.nan for v in VALUES}
    return runs, columns


def median_of(runs, version, key, direction, anchor_key=None):
    vals = []
    for (v, _), rows in runs.items():
        if v != version or key not in rows:
            continue
        x = rows[key][direction]
        if anchor_key is not None:
            x = x / rows[anchor_key][direction] if anchor_key in rows else math.nan
        if not math.isnan(x):
            vals.append(x)
    return statistics.median(vals) if vals else math.nan


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--ours", default="flash_attn_hopper", help="our provider's name in the CSVs (varlen: varlen)")
    p.add_argument("--anchor", default="sdpa-cudnn", help="the peer measured beside it (varlen: fa3-varlen)")
    p.add_argument("--tolerance", type=float, default=0.02)
    args = p.parse_args()
    runs, columns = load(args.out)
    points = sorted({k[:-1] for rows in runs.values() for k in rows})
    head = " | ".join(columns)
    lines = [",".join(columns) + ",direction,old_tflops,new_tflops,new_over_old,old_vs_anchor,new_vs_anchor"]
    md = [f"| {head} | dir | old TFLOP/s | new TFLOP/s | new / old | old / {args.anchor} | new / {args.anchor} |",
          "|" + "---|" * (len(columns) + 6)]
    outside = shown = 0
    for point in points:
        ours, anchor = (*point, args.ours), (*point, args.anchor)
        for direction in ("fwd", "bwd"):
            old, new = (median_of(runs, v, ours, direction) for v in ("old", "new"))
            if math.isnan(old) or math.isnan(new):
                continue
            rel_old, rel_new = (median_of(runs, v, ours, direction, anchor) for v in ("old", "new"))
            ratio = new / old
            shown += 1
            outside += abs(ratio - 1) > args.tolerance
            cells = ",".join(f'"{c}"' if "," in c else c for c in point)
            lines.append(f"{cells},{direction},{old:.1f},{new:.1f},{ratio:.3f},{rel_old:.3f},{rel_new:.3f}")
            md.append(f"| {' | '.join(point)} | {direction} | {old:.1f} | {new:.1f} | {ratio:.3f} | {rel_old:.3f} | "
                      f"{rel_new:.3f} |")
    rounds = sorted({r for _, r in runs})
    md += ["", f"{len(rounds)} rounds per version, alternating; {outside} of {shown} points outside "
               f"±{args.tolerance:.0%} (new / old)."]
    (args.out / "baseline.csv").write_text("\n".join(lines) + "\n")
    (args.out / "baseline.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 1 if outside or not shown else 0


if __name__ == "__main__":
    raise SystemExit(main())
