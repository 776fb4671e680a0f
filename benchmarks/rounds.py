"""What the issue benchmarks (benchmark_varlen.py, benchmark_decode.py, benchmark_scoremods.py) share
beyond benchmark_attn.py's timing: the rotated rounds of one grid point, and the results files
(csv, markdown, and a bar plot of the csv when matplotlib is there).

    python benchmarks/rounds.py plot benchmarks/results/decode-2026-12-05.csv   # the plot of a csv again
"""

from __future__ import annotations

import csv
import datetime
from pathlib import Path

import benchmark_attn as ba

RESULTS = Path(__file__).resolve().parent / "results"


def rotated_medians(runs: dict, point: int, rounds: int, measure, fields: tuple[str, ...]) -> dict[str, dict]:
    """{provider: {field: median over the rounds}} of one grid point: measure(name, run) returns an
    object with the fields; each round runs every provider, the order rotated per round and point
    (benchmark_attn.round_orders); NaN (a failed measurement) is left out of the median."""
    per = {name: [] for name in runs}
    for order in ba.round_orders(list(runs), point, rounds):
        for name in order:
            per[name].append(measure(name, runs[name]))
    return {name: {f: ba._median_finite([getattr(m, f) for m in ms]) for f in fields} for name, ms in per.items()}


def write_results(prefix: str, header: list[str], records: list[list], markdown: str, stem: Path | None = None) -> Path:
    """benchmarks/results/<prefix>-<UTC date>.csv and .md (or ``stem``.csv / .md); returns the stem."""
    stem = stem or RESULTS / f"{prefix}-{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d-%H%M}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{stem}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(records)
    Path(f"{stem}.md").write_text(markdown)
    print(f"wrote {stem}.csv and .md")
    plot_csv(Path(f"{stem}.csv"))
    return stem


# Columns that say how a measurement ran (benchmark_attn's round extremes, gpu_state's clock and
# power), neither a result nor part of the point: the plot leaves them out.
CONDITIONS = ("fwd_min", "fwd_max", "bwd_min", "bwd_max", "sm_mhz", "power_w")


def split_columns(columns: list[str]) -> tuple[list[str], list[str]]:
    """(result columns, the columns that name a point) of a results csv's header."""
    values = [c for c in columns if c.endswith("_tflops") or c == "gbps"]
    return values, [c for c in columns if c not in values and c != "provider" and c not in CONDITIONS]


def plot_csv(path: Path) -> Path | None:
    """<csv>.png: one horizontal bar per (point, provider) for each numeric column that is a result
    (the last columns: *_tflops, gbps), points labelled by the other columns; None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return None
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    values, keys = split_columns(list(rows[0]) if rows else [])
    if not values or "provider" not in rows[0]:
        print(f"{path.name}: no provider or result columns: no plot")
        return None
    providers = list(dict.fromkeys(r["provider"] for r in rows))
    points = list(dict.fromkeys(tuple(r[k] for k in keys) for r in rows))
    table = {(tuple(r[k] for k in keys), r["provider"]): r for r in rows}
    fig, axes = plt.subplots(1, len(values), figsize=(6 * len(values), 0.32 * len(points) * len(providers) + 1.5),
                             squeeze=False, sharey=True)
    height = 0.8 / len(providers)
    for ax, col in zip(axes[0], values):
        for i, prov in enumerate(providers):
            xs = [float(table[(pt, prov)][col] or "nan") if (pt, prov) in table else float("nan") for pt in points]
            ax.barh([p + i * height for p in range(len(points))], xs, height=height, label=prov)
        ax.set_xlabel(col.replace("_tflops", " TFLOP/s").replace("gbps", "GB/s of K and V read"))
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks([p + 0.4 - height / 2 for p in range(len(points))], [" ".join(pt) for pt in points],
                          fontsize=7)
    axes[0][0].invert_yaxis()
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.suptitle(path.stem)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "plot":
        sys.exit("usage: python benchmarks/rounds.py plot RESULTS.csv")
    plot_csv(Path(sys.argv[2]))
