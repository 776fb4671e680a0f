"""What the issue benchmarks (benchmark_varlen.py, benchmark_decode.py, benchmark_scoremods.py) share
beyond benchmark_attn.py's timing: the rotated rounds of one grid point, and the results files."""

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
    return stem
