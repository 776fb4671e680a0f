"""The baseline step's table (tools/gpu/run.sh): our kernels against an older commit's, point by
point, from the CSVs of alternating benchmark_attn.py runs under $OUT/baseline-{old,new}-<round>/.
Per point and direction: the median TFLOP/s of each version over the rounds, new / old, and each
version's ratio to sdpa-cudnn measured in the same process (drift between runs shows there).

    python3 tools/gpu/baseline_grid.py OUT_DIR [--tolerance 0.02]   # exit 1 if a point is outside
"""
import argparse
import csv
import math
import statistics
from pathlib import Path


def load(out: Path) -> dict:
    """{(version, round): {(hdim, causal, seqlen, provider): (fwd, bwd)}}"""
    runs = {}
    for folder in sorted(out.glob("baseline-*-*")):
        if not folder.is_dir():
            continue
        _, version, rnd = folder.name.split("-")
        for f in folder.glob("*.csv"):
            rows = runs.setdefault((version, int(rnd)), {})
            for r in csv.DictReader(f.open()):
                num = lambda x: float(x) if x else math.nan  # noqa: E731
                rows[(int(r["hdim"]), r["causal"], int(r["seqlen"]), r["provider"])] = (
                    num(r["fwd_tflops"]), num(r.get("bwd_tflops", "")))
    return runs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--tolerance", type=float, default=0.02)
    args = p.parse_args()
    runs = load(args.out)
    points = sorted({k[:3] for rows in runs.values() for k in rows})
    lines = ["hdim,causal,seqlen,direction,old_tflops,new_tflops,new_over_old,old_vs_cudnn,new_vs_cudnn"]
    md = ["| hdim | causal | seqlen | dir | old TFLOP/s | new TFLOP/s | new / old | old / cuDNN | new / cuDNN |",
          "|---|---|---|---|---|---|---|---|---|"]
    outside = 0
    for point in points:
        for direction, j in (("fwd", 0), ("bwd", 1)):
            med, anchor = {}, {}
            for version in ("old", "new"):
                ours = [rows[(*point, "flash_attn_hopper")][j] for (v, _), rows in runs.items()
                        if v == version and (*point, "flash_attn_hopper") in rows]
                rel = [rows[(*point, "flash_attn_hopper")][j] / rows[(*point, "sdpa-cudnn")][j]
                       for (v, _), rows in runs.items()
                       if v == version and (*point, "flash_attn_hopper") in rows and (*point, "sdpa-cudnn") in rows]
                ours = [x for x in ours if not math.isnan(x)]
                rel = [x for x in rel if not math.isnan(x)]
                med[version] = statistics.median(ours) if ours else math.nan
                anchor[version] = statistics.median(rel) if rel else math.nan
            if math.isnan(med["old"]) or math.isnan(med["new"]):
                continue
            ratio = med["new"] / med["old"]
            outside += abs(ratio - 1) > args.tolerance
            lines.append(f"{point[0]},{point[1]},{point[2]},{direction},{med['old']:.1f},{med['new']:.1f},{ratio:.3f},"
                         f"{anchor['old']:.3f},{anchor['new']:.3f}")
            md.append(f"| {point[0]} | {point[1]} | {point[2]} | {direction} | {med['old']:.1f} | {med['new']:.1f} | "
                      f"{ratio:.3f} | {anchor['old']:.3f} | {anchor['new']:.3f} |")
    rounds = sorted({r for _, r in runs})
    md.append("")
    md.append(f"{len(rounds)} rounds per version, alternating; {outside} of {len(md) - 3} points outside "
              f"±{args.tolerance:.0%}.")
    (args.out / "baseline.csv").write_text("\n".join(lines) + "\n")
    (args.out / "baseline.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 1 if outside or len(md) <= 4 else 0


if __name__ == "__main__":
    raise SystemExit(main())
