"""tools/gpu/baseline_grid.py: the baseline step's table from alternating runs' CSVs (no GPU)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from conftest import REPO_ROOT

_spec = importlib.util.spec_from_file_location("baseline_grid", REPO_ROOT / "tools" / "gpu" / "baseline_grid.py")
grid = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(grid)

ATTN = "provider,dtype,hdim,causal,seqlen,batch,nheads,fwd_tflops,bwd_tflops,fwd_min,fwd_max,bwd_min,bwd_max,sm_mhz,power_w\n"


def _write(out, version, rnd, name, text):
    folder = out / f"baseline-{version}-{rnd}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def _run(out, *args):
    return subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "gpu" / "baseline_grid.py"), str(out), *args],
                          capture_output=True, text=True)


def test_medians_ratios_and_the_verdict(tmp_path):
    # ours 500 / 505 / 510 (old) against 520 / 530 / 540 (new): medians 505 and 530, new / old 1.050;
    # the anchor reads 400 everywhere, so the anchored ratios are 1.2625 and 1.325.
    for rnd, (old, new) in enumerate([(500, 540), (510, 520), (505, 530)], start=1):
        for version, ours in (("old", old), ("new", new)):
            _write(tmp_path, version, rnd, "grid.csv", ATTN
                   + f"flash_attn_hopper,bf16,128,false,4096,4,16,{ours},300,0,0,0,0,1980,700\n"
                   + "sdpa-cudnn,bf16,128,false,4096,4,16,400,250,0,0,0,0,1980,700\n")
    proc = _run(tmp_path)
    assert proc.returncode == 1, proc.stdout  # 5 % is outside ±2 %
    rows = (tmp_path / "baseline.csv").read_text().splitlines()
    assert rows[0].startswith("dtype,hdim,causal,seqlen,batch,nheads,direction")
    fwd = next(r for r in rows if ",fwd," in r).split(",")
    assert fwd[-5:] == ["505.0", "530.0", "1.050", "1.262", "1.325"]
    bwd = next(r for r in rows if ",bwd," in r).split(",")
    assert bwd[-3] == "1.000"
    assert "1 of 2 points outside" in (tmp_path / "baseline.md").read_text()
    assert _run(tmp_path, "--tolerance", "0.06").returncode == 0


def test_varlen_csvs_with_quoted_cases_and_another_anchor(tmp_path):
    head = "provider,case,hdim,causal,fwd_tflops,bwd_tflops\n"
    for rnd in (1, 2):
        _write(tmp_path, "old", rnd, "run.csv", head + 'varlen,"32 x U[1,4k]",128,false,480,310\n'
               + 'fa3-varlen,"32 x U[1,4k]",128,false,600,540\n')
        _write(tmp_path, "new", rnd, "run.csv", head + 'varlen,"32 x U[1,4k]",128,false,490,320\n'
               + 'fa3-varlen,"32 x U[1,4k]",128,false,600,540\n')
    proc = _run(tmp_path, "--ours", "varlen", "--anchor", "fa3-varlen")
    assert proc.returncode == 1  # +2.1 % and +3.2 %
    table = (tmp_path / "baseline.md").read_text()
    assert "| 32 x U[1,4k] | 128 | false | fwd | 480.0 | 490.0 | 1.021 | 0.800 | 0.817 |" in table
    assert '"32 x U[1,4k]",128,false,bwd' in (tmp_path / "baseline.csv").read_text()


def test_no_runs_is_a_failure(tmp_path):
    assert _run(tmp_path).returncode == 1
