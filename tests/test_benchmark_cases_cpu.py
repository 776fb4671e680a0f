"""CPU checks of benchmarks/benchmark_varlen.py and benchmark_decode.py: the cases the issues name and their counts."""
from __future__ import annotations

import sys

import torch

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import benchmark_varlen as bv  # noqa: E402


def test_cases_are_the_issues():
    cs = {c.name: c for c in bv.cases("all")}
    assert cs["8x2k"].lengths == (2048,) * 8 and cs["2x8k"].lengths == (8192,) * 2
    uniform = cs["32 x U[1,4k]"].lengths
    assert len(uniform) == 32 and all(1 <= n <= 4096 for n in uniform) and len(set(uniform)) > 1
    mix = cs["16k + 64 x U[16,512]"].lengths
    assert mix[0] == 16384 and len(mix) == 65 and all(16 <= n <= 512 for n in mix[1:])
    assert [c.lengths for c in bv.cases("ragged")] == [c.lengths for c in bv.cases("ragged")]  # seeded
    assert not any(c.ragged for c in bv.cases("equal")) and all(c.ragged for c in bv.cases("ragged"))


def test_attended_pairs():
    assert bv.attended_pairs([3], causal=False) == 9
    assert bv.attended_pairs([3], causal=True) == 6  # 1 + 2 + 3
    assert bv.attended_pairs([2048] * 8, causal=False) == 8 * 2048 * 2048
    assert bv.attended_pairs([0, 1], causal=True) == 1


def test_decode_grid_and_bytes():
    import benchmark_decode as bd

    assert bd.kv_bytes(8, 32768, 8, 128) == 2 * 8 * 32768 * 8 * 128 * 2
    pts = list(bd.points([1, 8, 64], [4096, 32768, 131072], ["32:8", "8:1"], [64, 128, 256], max_gib=40.0))
    assert (1, 4096, "32:8", 64) in pts and (64, 131072, "32:8", 256) not in pts  # 64 GiB of K+V: skipped
    assert all(bd.kv_bytes(b, c, bd.GQA[g][1], h) <= 40 * 2**30 for b, c, g, h in pts)


def test_scoremods_report_gives_the_bars_ratios():
    import benchmark_scoremods as bs

    rows = [bs.Row("plain", 128, False, 8192, 600.0, 400.0), bs.Row("softcap", 128, False, 8192, 540.0, 350.0),
            bs.Row("sink", 128, False, 8192, 590.0, 396.0), bs.Row("fa3-softcap", 128, False, 8192, 500.0, 360.0)]
    md = bs.markdown(rows, {"date": "2026-12-05", "gpu": "H200", "torch": "2.11", "flash_attn_hopper": "0.1.0"})
    assert "| 128 | false | 8192 | softcap / plain | 0.900 | 0.875 |" in md
    assert "| 128 | false | 8192 | sink / plain | 0.983 | 0.990 |" in md
    assert "| 128 | false | 8192 | softcap / fa3-softcap | 1.080 | 0.972 |" in md
    assert "plain / fa3 |" not in md  # no fa3 row measured: no ratio made up
    assert set(bs.PROVIDERS) >= {a for a, _ in bs.RATIOS} | {b for _, b in bs.RATIOS}


def test_scoremods_flops_count_each_gemm_at_its_head_dim():
    import benchmark_scoremods as bs

    fwd, bwd = bs.flops_of(2, 3, 100, 128, 128, causal=False)
    assert fwd == 4 * 2 * 3 * 100 * 100 * 128 and bwd == 2.5 * fwd  # benchmark_attn.py's convention
    fwd, bwd = bs.flops_of(2, 3, 100, 192, 128, causal=True)
    assert fwd == 2 * 2 * 3 * 100 * 100 * (192 + 128) / 2 and bwd == 2 * 2 * 3 * 100 * 100 * (3 * 192 + 2 * 128) / 2


def test_rotated_rounds_give_each_providers_median_and_write_both_files(tmp_path):
    import math
    from types import SimpleNamespace

    import rounds

    calls = []

    def measure(name, run):
        calls.append(name)
        return SimpleNamespace(fwd=run(len(calls)), bwd=math.nan)

    runs = {"a": lambda i: float(i), "b": lambda i: 100.0 + i}
    medians = rounds.rotated_medians(runs, point=1, rounds=3, measure=measure, fields=("fwd", "bwd"))
    assert calls == ["b", "a", "a", "b", "b", "a"]  # rotated per round and point
    assert medians["a"]["fwd"] == 3.0 and medians["b"]["fwd"] == 104.0 and math.isnan(medians["a"]["bwd"])
    stem = rounds.write_results("x", ["p", "v"], [["a", "1.0"]], "# md\n", tmp_path / "r")
    assert (tmp_path / "r.csv").read_text().splitlines() == ["p,v", "a,1.0"] and (tmp_path / "r.md").read_text() == "# md\n"
    assert stem == tmp_path / "r"


def test_decode_report_takes_our_best_provider_against_the_best_peer():
    import benchmark_decode as bd

    rows = [bd.Row("flash_attn_hopper-nosplit", 8, 32768, "32:8", 128, 1600.0),
            bd.Row("flash_attn_hopper", 8, 32768, "32:8", 128, 3800.0),
            bd.Row("sdpa-cudnn", 8, 32768, "32:8", 128, 4000.0), bd.Row("sdpa-flash", 8, 32768, "32:8", 128, 3000.0)]
    md = bd.markdown(rows, {"date": "d", "gpu": "g", "torch": "t", "flash_attn_hopper": "v"})
    assert md.rstrip().endswith("| 8 | 32768 | 32:8 | 128 | 1600 | 3800 | 4000 | 3000 | 0.95 |  |")
    # Paged providers get their own ratio, against the contiguous peers; FA3's paged one is no peer of those.
    rows += [bd.Row("flash_attn_hopper-paged16", 8, 32768, "32:8", 128, 3600.0),
             bd.Row("fa3-paged16", 8, 32768, "32:8", 128, 4400.0)]
    md = bd.markdown(rows, {"date": "d", "gpu": "g", "torch": "t", "flash_attn_hopper": "v"})
    assert md.rstrip().endswith("| 1600 | 3800 | 4000 | 3000 | 3600 | 4400 | 0.95 | 0.90 |")


def test_decode_paged_provider_views_the_cache_as_pages():
    import benchmark_decode as bd

    seen = []
    run = bd._paged(lambda q, k, v, page_table, causal: seen.append((k, page_table, causal)) or q, 16)
    q, k = torch.zeros(2, 1, 4, 8), torch.arange(2 * 64 * 2 * 8, dtype=torch.float32).view(2, 64, 2, 8)
    run(q, k, k)
    run(q, k, k)
    (pages, table, causal), (_, table2, _) = seen
    assert pages.shape == (8, 16, 2, 8) and pages.data_ptr() == k.data_ptr() and not causal
    assert table is table2 and table.dtype == torch.int32 and sorted(table.flatten().tolist()) == list(range(8))


def test_fp8_report_records_the_clocks_and_the_plot_keeps_them_out_of_the_points(tmp_path):
    import benchmark_fp8 as bf
    import rounds

    rows = [bf.Row("flash_attn_hopper", 128, False, 4096, 900.0, 1755.0, 690.0),
            bf.Row("fa3", 128, False, 4096, 1000.0, 1980.0, 650.0),
            bf.Row("flash_attn_hopper", 128, True, 4096, 700.0, 1740.0, 700.0),
            bf.Row("fa3", 128, True, 4096, 700.0, float("nan"), float("nan"))]
    md = bf.markdown(rows, {"date": "d", "gpu": "g", "torch": "t", "flash_attn_hopper": "f"})
    assert "| 128 | False | 4096 | 900 | 1000 | 0.900 |" in md
    assert "flash_attn_hopper 1748 MHz / 695 W, fa3 1980 MHz / 650 W" in md
    csv_path = tmp_path / "fp8.csv"
    csv_path.write_text("provider,hdim,causal,seqlen,fwd_tflops,sm_mhz,power_w\n"
                        "flash_attn_hopper,128,False,4096,900.0,1755,690\nfa3,128,False,4096,1000.0,1980,650\n")
    png = rounds.plot_csv(csv_path)
    if png is not None:  # matplotlib installed: one point (hdim, causal, seqlen), not one per clock reading
        assert png.exists()
    header = ["provider", "hdim", "causal", "seqlen", "fwd_tflops", "sm_mhz", "power_w"]
    assert rounds.split_columns(header) == (["fwd_tflops"], ["hdim", "causal", "seqlen"])
