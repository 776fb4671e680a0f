"""The benchmark harness's reports, from synthetic measurements (no GPU needed)."""

from __future__ import annotations

import csv
import importlib.util
import math
import statistics
import sys

import pytest

from conftest import REPO_ROOT

_spec = importlib.util.spec_from_file_location("benchmark_attn", REPO_ROOT / "benchmarks" / "benchmark_attn.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["benchmark_attn"] = bench  # dataclasses look up their module while the class is built
_spec.loader.exec_module(bench)

ENV = {"date": "2026-11-30 00:00 UTC", "gpu": "NVIDIA H200 (132 SMs, sm_90)", "torch": "2.11.0", "cuda": "13.0",
       "cudnn": "91900", "python": "3.12", "triton": "3.6", "flash_attn_hopper": "0.1.0 (compiled: hdim128 bf16)"}


def _rows():
    Row = bench.Row
    return [
        Row("flash_attn_hopper", "bf16", 128, False, 8192, 2, 16, 720.0, math.nan),
        Row("sdpa-cudnn", "bf16", 128, False, 8192, 2, 16, 680.0, 590.0),
        Row("sdpa-flash", "bf16", 128, False, 8192, 2, 16, 360.0, 300.0),
        Row("flash_attn_hopper", "bf16", 128, True, 8192, 2, 16, math.nan, math.nan),  # a failed point
        Row("sdpa-cudnn", "bf16", 128, True, 8192, 2, 16, 600.0, 530.0),
        Row("sdpa-flash", "bf16", 128, True, 8192, 2, 16, 320.0, 280.0),
    ]


def test_flops_follow_the_method():
    assert bench.fwd_flops(2, 16, 8192, 128, False) == 4 * 2 * 16 * 8192**2 * 128
    assert bench.fwd_flops(2, 16, 8192, 128, True) == 2 * 2 * 16 * 8192**2 * 128
    assert bench.TOKENS // 8192 == 2 and bench.HEADS_X_HDIM // 128 == 16


def test_csv_has_the_issue_columns(tmp_path):
    path = tmp_path / "latest.csv"
    bench.write_csv(_rows(), path)
    rows = list(csv.reader(path.open()))
    assert rows[0] == ["provider", "dtype", "hdim", "causal", "seqlen", "batch", "nheads", "fwd_tflops", "bwd_tflops",
                       "fwd_min", "fwd_max", "bwd_min", "bwd_max", "sm_mhz", "power_w"]
    assert rows[1][:9] == ["flash_attn_hopper", "bf16", "128", "false", "8192", "2", "16", "720.0", "nan"]
    assert len(rows) == 7


def test_markdown_ratios_and_reference(tmp_path):
    args = bench.parse_args(["--hdims", "128", "--seqlens", "8192", "--bwd"])
    md = bench.markdown(_rows(), ENV, args, {("sdpa-cudnn", 128, True): 2.1e-3}, ["flash_attn_hopper", "sdpa-cudnn", "sdpa-flash"])
    assert "NVIDIA H200" in md and "cuDNN 91900" in md and "2026-11-30" in md
    # 720 / 680 = 1.06 vs cuDNN, 720 / 360 = 2.00 vs FA2; BENCHMARKS.md: FA3 699 -> 1.03, best 699.
    line = next(l for l in md.splitlines() if l.startswith("| 128 | no | 8192 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[4] == "**720**" and cells[5] == "680" and cells[6] == "360"
    assert cells[7] == "1.06" and cells[8] == "2.00"
    assert cells[9] == "699" and cells[10] == "1.03"
    failed = next(l for l in md.splitlines() if l.startswith("| 128 | yes | 8192 |"))
    assert "**–**" in failed
    assert "- vs sdpa-cudnn: ≥ 1.00x at 1/1 points; ratio min 1.06, geomean 1.06, max 1.06; " \
        "flash_attn_hopper has no result at 1 point(s)" in md
    assert "## Backward" in md and "2.1e-03" in md


def test_reference_table_is_the_first_table_of_benchmarks_md():
    text = (REPO_ROOT.parent / "shared" / "BENCHMARKS.md")
    if not text.is_file():
        pytest.skip("shared/BENCHMARKS.md is not beside this checkout")
    lines = text.read_text().split("### One run")[1].split("###")[0].splitlines()
    parsed = {}
    for line in lines:
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if len(cells) == 11 and cells[0].isdigit():
            hdim, causal, seqlen = int(cells[0]), cells[1] == "yes", int(cells[2])
            parsed[(hdim, causal, seqlen)] = (int(cells[3]), int(cells[6]), int(cells[7]), int(cells[10]))
    assert parsed == bench.BENCHMARKS_MD_REFERENCE


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    assert bench.plot(_rows(), tmp_path / "p.png", ["flash_attn_hopper", "sdpa-cudnn"], True, "bf16")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_rounds_rotate_the_provider_order():
    providers = ["flash_attn_hopper", "sdpa-cudnn", "sdpa-flash"]
    firsts = []
    for point in range(4):
        orders = bench.round_orders(providers, point, 3)
        assert len(orders) == 3
        assert all(sorted(order) == sorted(providers) for order in orders)  # each round runs every provider once
        firsts += [order[0] for order in orders]
    # Over points and rounds, every provider leads equally often (12 rounds, 3 providers).
    assert {p: firsts.count(p) for p in providers} == {p: 4 for p in providers}
    assert bench.round_orders(providers, 0, 1) == [providers]
    assert bench.round_orders(providers, 1, 1) == [["sdpa-cudnn", "sdpa-flash", "flash_attn_hopper"]]


def test_rounds_report_the_median_of_finite_measurements():
    Row = bench.Row
    rounds = [Row("sdpa-cudnn", "bf16", 128, False, 8192, 2, 16, 600.0, math.nan),
              Row("sdpa-cudnn", "bf16", 128, False, 8192, 2, 16, 660.0, 500.0),
              Row("sdpa-cudnn", "bf16", 128, False, 8192, 2, 16, 610.0, math.nan)]
    row = bench.combine_rounds(rounds)
    assert (row.provider, row.hdim, row.causal, row.seqlen, row.batch, row.nheads) == ("sdpa-cudnn", 128, False, 8192, 2, 16)
    assert row.fwd_tflops == 610.0 and row.bwd_tflops == 500.0
    assert (row.fwd_min, row.fwd_max, row.bwd_min, row.bwd_max) == (600.0, 660.0, 500.0, 500.0)
    failed = bench.combine_rounds([Row("fa3", "bf16", 64, True, 512, 32, 32)] * 2)
    assert math.isnan(failed.fwd_tflops) and math.isnan(failed.bwd_tflops)


def test_rounds_must_be_positive_and_are_stated_in_the_method(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--rounds", "0"])
    assert "--rounds must be at least 1" in capsys.readouterr().err
    args = bench.parse_args(["--hdims", "128", "--seqlens", "8192", "--rounds", "3"])
    md = bench.markdown(_rows(), ENV, args, {}, ["flash_attn_hopper", "sdpa-cudnn", "sdpa-flash"])
    assert "the median of 3 rounds" in md and "rotated" in md


def test_spread_and_clocks_are_reported():
    Row = bench.Row
    rounds = [Row("flash_attn_hopper", "bf16", 128, False, 8192, 2, 16, 600.0, 500.0, sm_mhz=1980.0, power_w=690.0),
              Row("flash_attn_hopper", "bf16", 128, False, 8192, 2, 16, 660.0, 550.0, sm_mhz=1755.0, power_w=700.0),
              Row("flash_attn_hopper", "bf16", 128, False, 8192, 2, 16, 630.0, 520.0, sm_mhz=1900.0, power_w=695.0)]
    row = bench.combine_rounds(rounds)
    assert (row.sm_mhz, row.power_w) == (1900.0, 695.0)
    lines = bench.spread_lines([row], ["flash_attn_hopper"], ["fwd", "bwd"])
    assert lines[0] == "## Spread and clocks"
    assert lines[-1] == "| flash_attn_hopper | 10.0% | 10.0% | 1900 | 695 |"
    assert all(math.isnan(x) for x in bench.gpu_state()) or all(x > 0 for x in bench.gpu_state())


def test_sampler_reads_the_gpu_state_while_the_block_runs(monkeypatch):
    import time

    import gpu_state  # benchmarks/, put on the path by benchmark_attn

    readings = iter([(1500.0 + i, 600.0 + i) for i in range(10_000)])
    monkeypatch.setattr(gpu_state, "gpu_state", lambda: next(readings))
    with gpu_state.Sampler(interval=0.002) as sampler:
        time.sleep(0.1)
    n = len(sampler.samples)
    assert n >= 3  # sampled during the block, not once after it
    assert sampler.samples == [(1500.0 + i, 600.0 + i) for i in range(n)]
    assert sampler.median() == (statistics.median(1500.0 + i for i in range(n)), statistics.median(600.0 + i for i in range(n)))
    with gpu_state.Sampler(interval=60.0) as short:  # shorter than one interval: one reading at exit
        pass
    assert short.samples == [(1500.0 + n, 600.0 + n)]


def test_sampler_without_nvml_reports_nan(monkeypatch):
    import gpu_state

    monkeypatch.setattr(gpu_state, "gpu_state", lambda: (math.nan, math.nan))
    with gpu_state.Sampler(interval=60.0) as sampler:
        pass
    assert all(math.isnan(x) for x in sampler.median())
