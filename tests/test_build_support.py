"""setup.py's helpers: flags, MAX_JOBS sizing, the ninja-log report, toolkit and CUTLASS
discovery, the recorded build config -- and setup.py's own early exits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tools" / "build"))
import build_support as bs  # noqa: E402


def test_nvcc_flags_follow_the_contract():
    flags = bs.nvcc_flags({})
    for flag in (
        "-gencode=arch=compute_90a,code=sm_90a",
        "-O3",
        "-std=c++20",
        "-DNDEBUG",
        "--expt-relaxed-constexpr",
        "--use_fast_math",
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-lineinfo",
    ):
        assert flag in flags
    assert "-Xptxas=-v" not in flags
    assert "-Xptxas=-v" in bs.nvcc_flags({"FLASH_ATTN_HOPPER_VERBOSE_PTXAS": "1"})
    assert bs.CXX_FLAGS == ["-O3", "-std=c++20"]
    assert bs.cxx_flags({}) == bs.CXX_FLAGS


def test_extra_nvcc_flags_reach_nvcc_and_their_macros_reach_the_binding():
    env = {"FLASH_ATTN_HOPPER_EXTRA_NVCC_FLAGS": "-DFLASH_FWD_DEV_X=1 -Xptxas=-warn-spills -D FLASH_BWD_DEV_Y -UZ"}
    flags = bs.nvcc_flags(env)
    assert flags[: len(bs.NVCC_FLAGS)] == bs.NVCC_FLAGS
    assert flags[len(bs.NVCC_FLAGS):] == ["-DFLASH_FWD_DEV_X=1", "-Xptxas=-warn-spills", "-D", "FLASH_BWD_DEV_Y", "-UZ"]
    # The host compiler gets the macros only (it knows no -Xptxas).
    assert bs.cxx_flags(env) == bs.CXX_FLAGS + ["-DFLASH_FWD_DEV_X=1", "-D", "FLASH_BWD_DEV_Y", "-UZ"]
    assert bs.extra_nvcc_flags({"FLASH_ATTN_HOPPER_EXTRA_NVCC_FLAGS": "  "}) == []


@pytest.mark.parametrize(
    "cores, mem_gb, files, expected",
    [
        (2, 24.0, 2, 2),  # CI: 2 cores, 24 GB
        (2, 9.5, 3, 1),  # the same machine with another build running: one job (2 x 3.25 GB would be tight)
        (16, 128.0, 10, 10),  # the H200 host: enough memory for every core, capped by the file count
        (16, 22.0, 10, 4),  # memory-bound: 22 GB / 5 GB per job
        (16, None, 10, 10),  # unknown memory: cores only
        (8, 3.0, 10, 1),  # never below one job
        (64, 512.0, 3, 3),
    ],
)
def test_default_max_jobs(cores, mem_gb, files, expected):
    jobs, why = bs.default_max_jobs(cores, mem_gb, files)
    assert jobs == expected
    assert f"{cores} cores" in why
    if mem_gb is not None:  # the default never plans more than the memory available for measured jobs
        assert jobs == 1 or jobs * bs.MEASURED_PEAK_GB_PER_JOB * 1.5 <= mem_gb


def test_memory_budget_covers_the_measured_peak_with_margin():
    assert bs.GB_PER_COMPILE_JOB >= 1.5 * bs.MEASURED_PEAK_GB_PER_JOB


def test_available_memory_parses_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       25165824 kB\nMemFree:  100 kB\nMemAvailable:   20971520 kB\n")
    assert bs.available_memory_gb(str(meminfo)) == pytest.approx(20.0)
    assert bs.available_memory_gb(str(tmp_path / "missing")) is None


NINJA_LOG = (
    "# ninja log v5\n"
    "0\t4000\t0\t/b/flash_api.o\taaaa\n"
    "0\t300500\t0\t/b/csrc/generated/flash_fwd_hdim128_bf16_sm90.o\tbbbb\n"
)


def test_parse_ninja_log_reports_longest_first_and_only_the_last_run(tmp_path):
    log = tmp_path / ".ninja_log"
    log.write_text(NINJA_LOG)
    records = bs.parse_ninja_log(log)
    assert [(Path(r.output).name, r.seconds) for r in records] == [
        ("flash_fwd_hdim128_bf16_sm90.o", 300.5),
        ("flash_api.o", 4.0),
    ]
    offset = log.stat().st_size
    with log.open("a") as f:
        f.write("10\t2010\t0\t/b/flash_api.o\tcccc\n")  # a later incremental build
    assert [(Path(r.output).name, r.seconds) for r in bs.parse_ninja_log(log, offset)] == [("flash_api.o", 2.0)]
    report = bs.format_compile_report(records, 301.0, 2)
    assert "2 file(s) in 301.0 s wall with 2 job(s)" in report
    assert "300.5 s  flash_fwd_hdim128_bf16_sm90.o" in report


def _fake_toolkit(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (root / "include" / "cuda_runtime.h").write_text("")
    return root


def test_resolve_cuda_home_prefers_a_valid_env_and_rejects_a_wrong_one(tmp_path):
    good = _fake_toolkit(tmp_path / "cuda")
    assert bs.resolve_cuda_home({"CUDA_HOME": str(good)}) == (str(good), "$CUDA_HOME")
    root, why = bs.resolve_cuda_home({"CUDA_HOME": str(tmp_path)})
    assert root is None and "is not a CUDA toolkit root" in why


def test_resolve_cuda_home_follows_an_nvcc_wrapper(tmp_path, monkeypatch):
    """A wrapper script on PATH (like /usr/local/bin/nvcc) must resolve to the toolkit it runs."""
    toolkit = _fake_toolkit(tmp_path / "cuda-13.0")
    (toolkit / "bin" / "nvcc").write_text(f'#!/bin/sh\necho "#$ _HERE_={toolkit}/bin"\n')
    (toolkit / "bin" / "nvcc").chmod(0o755)
    wrappers = tmp_path / "wrappers"
    wrappers.mkdir()
    (wrappers / "nvcc").write_text(f'#!/bin/sh\nexec {toolkit}/bin/nvcc "$@"\n')
    (wrappers / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrappers}{os.pathsep}{os.environ['PATH']}")
    assert bs.resolve_cuda_home({}) == (str(toolkit.resolve()), "the nvcc on PATH (nvcc --dryrun)")


def _fake_cutlass(root: Path, version=(4, 2, 0)) -> Path:
    (root / "include" / "cutlass").mkdir(parents=True)
    (root / "include" / "cute").mkdir()
    (root / "include" / "cutlass" / "cutlass.h").write_text("")
    (root / "include" / "cutlass" / "version.h").write_text(
        "".join(f"#define CUTLASS_{k} {v}\n" for k, v in zip(("MAJOR", "MINOR", "PATCH"), version))
    )
    return root


def test_find_cutlass_order(tmp_path):
    home = _fake_cutlass(tmp_path / "home", (3, 9, 1))
    loc = bs.find_cutlass(tmp_path / "repo", {"CUTLASS_HOME": str(home)})
    assert loc.origin == "$CUTLASS_HOME" and loc.version() == "3.9.1"
    assert loc.include_dirs == [str(home.resolve() / "include"), str(home.resolve() / "tools" / "util" / "include")]
    with pytest.raises(RuntimeError, match="CUTLASS_HOME=.*no include/cutlass/cutlass.h"):
        bs.find_cutlass(tmp_path / "repo", {"CUTLASS_HOME": str(tmp_path)})
    _fake_cutlass(tmp_path / "repo" / "third_party" / "cutlass")
    assert bs.find_cutlass(tmp_path / "repo", {}).origin == "third_party/cutlass"


def test_find_cutlass_in_the_nvidia_cutlass_package(tmp_path):
    pytest.importorskip("cutlass_library", reason="the nvidia-cutlass package is not installed")
    loc = bs.find_cutlass(tmp_path, {})
    assert loc.origin == "the nvidia-cutlass package"
    assert (loc.root / "include" / "cute" / "tensor.hpp").is_file()
    assert (loc.root / "tools" / "util" / "include" / "cutlass" / "util" / "packed_stride.hpp").is_file()
    assert loc.version() is not None and int(loc.version().split(".")[0]) >= 3


def test_build_config_round_trips(tmp_path):
    config = {"compiled": [{"direction": "fwd", "hdim": 128, "dtype": "bf16"}], "build_seconds": 12.5, "x": None}
    target = tmp_path / "pkg" / "_build_config.py"
    bs.write_build_config(config, target)
    namespace = {}
    exec(target.read_text(), namespace)
    assert namespace["CONFIG"] == config


def _run_setup(env_updates: dict, *python_flags: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **env_updates)
    return subprocess.run(
        [sys.executable, *python_flags, "setup.py", "--version"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_setup_stops_with_a_one_line_fix_without_torch():
    # -S -I: no site-packages, so torch is not importable, as in an isolated build.
    proc = _run_setup({}, "-S", "-I")
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "pip install --no-build-isolation" in lines[0] and "PyTorch" in lines[0]


def test_setup_rejects_a_bad_knob_before_generating():
    pytest.importorskip("torch")
    proc = _run_setup({"FLASH_ATTN_HOPPER_DTYPES": "fp32"})
    assert proc.returncode == 1
    assert "error: FLASH_ATTN_HOPPER_DTYPES='fp32': unknown dtype 'fp32'" in proc.stderr


def test_developer_knobs_are_read_in_policy_h_only_and_documented():
    """docs/dev-knobs.md: every compile-time knob is read in policy.h, none in a kernel body, and
    each one policy.h defaults is in the table."""
    import re

    csrc = REPO_ROOT / "csrc"
    policy = csrc / "kernel" / "common" / "policy.h"
    knob = re.compile(r"\bFLASH_(?:FWD|BWD)_(?:DEV_[A-Z0-9_]+|LONG_[A-Z0-9_]+)\b")
    elsewhere = {str(p.relative_to(REPO_ROOT)): sorted(set(knob.findall(p.read_text())))
                 for p in csrc.rglob("*") if p.is_file() and p != policy and p.suffix in (".h", ".cuh", ".cu", ".cpp")}
    assert {p: k for p, k in elsewhere.items() if k} == {}
    defaulted = set(re.findall(r"#ifndef (FLASH_\w+)", policy.read_text())) & set(knob.findall(policy.read_text()))
    assert defaulted, "policy.h defaults no knob: the pattern above is stale"
    documented = (REPO_ROOT / "docs" / "dev-knobs.md").read_text()
    assert sorted(k for k in defaulted if f"`{k}`" not in documented) == []
