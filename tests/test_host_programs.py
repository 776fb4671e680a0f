"""CPU tests of the CUDA sources themselves: compile host-only programs against the kernel
headers with nvcc and run them (tests/host/). They check, without a GPU, facts the kernels rely
on: register layouts and the scheduling arithmetic. Skipped, with the reason, where there is no
CUDA toolkit or no CUTLASS headers."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tools" / "build"))
import build_support as bs  # noqa: E402


def _compile_and_run(source: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    cuda_home, how = bs.resolve_cuda_home()
    if cuda_home is None:
        pytest.skip(f"no CUDA toolkit to compile host checks with: {how}")
    try:
        cutlass = bs.find_cutlass(REPO_ROOT)
    except RuntimeError as err:
        pytest.skip(str(err))
    exe = tmp_path / source.stem
    cmd = [
        str(Path(cuda_home) / "bin" / "nvcc"), str(source), "-o", str(exe),
        "-gencode=arch=compute_90a,code=sm_90a", "-O1", "-std=c++20", "--expt-relaxed-constexpr",
        f"-I{REPO_ROOT / 'csrc'}", *(f"-I{d}" for d in cutlass.include_dirs),
        f"-I{Path(cuda_home) / 'include' / 'cccl'}",
    ]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, f"nvcc failed:\n{build.stderr[-4000:]}"
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)


def test_bwd_epilogue_accumulator_layout(tmp_path):
    run = _compile_and_run(REPO_ROOT / "tests" / "host" / "bwd_epilogue_layout.cu", tmp_path)
    print(run.stdout)
    assert run.returncode == 0, f"layout mismatch:\n{run.stdout}{run.stderr}"
    lines = [line for line in run.stdout.splitlines() if line.startswith("hdim ")]
    assert len(lines) == 5 and all(line.endswith(" 0 mismatches") for line in lines), run.stdout
    assert all(int(line.split(":")[1].split()[0]) > 0 for line in lines), run.stdout


def test_scheduling_arithmetic(tmp_path):
    run = _compile_and_run(REPO_ROOT / "tests" / "host" / "schedule_checks.cu", tmp_path)
    print(run.stdout)
    assert run.returncode == 0, f"scheduling check failed:\n{run.stdout}{run.stderr}"
    lines = [line for line in run.stdout.splitlines() if "random shapes" in line or "tile counter" in line]
    assert len(lines) == 18 and all(line.endswith(" 0 failures") for line in lines), run.stdout
