"""Packaging (issue 44, items 2, 3 and 5): the sdist, the metadata, the wheel script, the torch range
and the build's per-file memory report. All on the CPU, without compiling anything."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tools" / "build"))

import build_support as bs  # noqa: E402

import flash_attn_hopper  # noqa: E402
from flash_attn_hopper import _build_info  # noqa: E402


def _source_version() -> str:
    text = (REPO_ROOT / "flash_attn_hopper" / "_version.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE).group(1)


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> tarfile.TarFile:
    """The sdist, built as `python -m build --sdist` would (setuptools' PEP 517 hook), with torch
    made unimportable as in an isolated build: packing the sources needs no torch, toolkit or CUTLASS."""
    out = tmp_path_factory.mktemp("sdist")
    code = ("import sys; sys.modules['torch'] = None\n"
            "from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))")
    # location: checkout (packs the checkout; imports no flash_attn_hopper)
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, CUDA_HOME="/nonexistent", CUTLASS_HOME="/nonexistent"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    name = proc.stdout.strip().splitlines()[-1]
    return tarfile.open(out / name)


def test_sdist_has_what_the_build_needs_and_no_history(sdist):
    top = f"flash_attn_hopper-{_source_version()}/"
    names = {n.removeprefix(top) for n in sdist.getnames()}
    for needed in ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "PKG-INFO", "csrc/flash_api.cpp",
                   "tools/build/build_support.py", "tools/build/generate_instantiations.py",
                   "tools/build/measure_compile.py", "tools/build/build_wheel.sh", "flash_attn_hopper/manifest.py",
                   "flash_attn_hopper/_version.py"):
        assert needed in names, needed
    tracked = subprocess.run(["git", "ls-files", "csrc"], cwd=REPO_ROOT, capture_output=True, text=True).stdout.split()
    if tracked:  # every tracked kernel source and header ships
        assert set(tracked) <= names, sorted(set(tracked) - names)
    for unwanted in ("benchmarks/", "docs/", "tests/", "csrc/generated/", ".ci/", ".github/"):
        assert not [n for n in names if n.startswith(unwanted)], unwanted
    assert not [n for n in names if n.endswith((".so", ".pyc", "_build_config.py"))]


def test_sdist_metadata(sdist):
    top = f"flash_attn_hopper-{_source_version()}/"
    pkg_info = sdist.extractfile(top + "PKG-INFO").read().decode()
    assert f"Version: {_source_version()}\n" in pkg_info
    assert "Requires-Python: >=3.10" in pkg_info
    requires = pkg_info  # older setuptools (metadata 2.1) lists requirements only in egg-info's requires.txt
    if "Requires-Dist:" not in pkg_info:
        requires = sdist.extractfile(top + "flash_attn_hopper.egg-info/requires.txt").read().decode()
    assert f"torch>={flash_attn_hopper._version.TORCH_MIN_VERSION}" in requires
    assert "Classifier: Environment :: GPU :: NVIDIA CUDA :: 12" in pkg_info
    assert "Classifier: Operating System :: POSIX :: Linux" in pkg_info


def test_version_has_one_home():
    assert flash_attn_hopper.__version__ == _source_version()
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and not re.search(r"^version\s*=", pyproject, re.MULTILINE)
    for path in ("setup.py", "flash_attn_hopper/__init__.py"):
        assert f'"{_source_version()}"' not in (REPO_ROOT / path).read_text(), path


def test_wheel_script_is_the_route_of_ci_and_the_workflow():
    script = REPO_ROOT / "tools" / "build" / "build_wheel.sh"
    assert os.access(script, os.X_OK)
    help_text = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "--minimal" in help_text and "--local-version" in help_text
    assert "tools/build/build_wheel.sh --minimal" in (REPO_ROOT / ".ci" / "run").read_text()
    workflow = (REPO_ROOT / ".github" / "workflows" / "wheels.yml").read_text()
    assert "tools/build/build_wheel.sh" in workflow and "aarch64" in workflow and "x86_64" in workflow
    assert "upload-artifact" in workflow and "refs/tags/v" in workflow


@pytest.mark.parametrize("version, expected", [
    ("2.14.1+cu130", ">=2.14,<2.15"), ("2.11.0a0+git1234", ">=2.11,<2.12"), ("3.0.0", ">=3.0,<3.1"),
])
def test_same_minor_requirement(version, expected):
    assert bs.same_minor_requirement(version) == expected


@pytest.mark.parametrize("requirement, torch_version, met", [
    (">=2.14,<2.15", "2.14.1+cu130", True),
    (">=2.14,<2.15", "2.14.0", True),
    (">=2.14,<2.15", "2.15.0", False),
    (">=2.14,<2.15", "2.11.0", False),
    (">=2.11,<2.12", "2.11.0a0+gitabc", True),
    (None, "2.14.1", None),
    ("~=2.14", "2.14.1", None),  # a form it does not parse: unknown, not a guess
])
def test_torch_requirement_met(requirement, torch_version, met):
    assert _build_info.torch_requirement_met(requirement, torch_version) is met


def test_build_info_states_the_torch_range():
    info = flash_attn_hopper.build_info()
    assert info["torch_min_version"] == flash_attn_hopper._version.TORCH_MIN_VERSION
    assert "torch_requirement" in info and "torch_requirement_met" in info
    if info["build_config_found"]:
        # torch's stable ABI, targeted at the oldest supported torch: every torch from that one on
        assert info["torch_requirement"] == f">={info['torch_min_version']}"
        assert info["torch_abi"].startswith(f"stable ABI (TORCH_TARGET_VERSION {info['torch_min_version']})")
        assert info["torch_requirement_met"] is True
    from flash_attn_hopper.__main__ import torch_range_summary

    line = torch_range_summary(info)
    assert f"torch >= {info['torch_min_version']}" in line


def test_compile_memory_log_and_report(tmp_path):
    log = tmp_path / "compile_memory.tsv"
    log.write_text("/b/flash_fwd_hdim128_bf16_sm90.o\t61.0\t3145728\t0\n"
                   "/b/flash_bwd_hdim128_bf16_sm90.o\t80.5\t2097152\t0\ngarbage\n")
    peaks = bs.parse_compile_log(log)
    assert peaks == {"flash_fwd_hdim128_bf16_sm90.o": 3.0, "flash_bwd_hdim128_bf16_sm90.o": 2.0}
    report = bs.format_compile_report([bs.CompileRecord("/b/flash_fwd_hdim128_bf16_sm90.o", 61.0)], 62.0, 2, peaks)
    assert "61.0 s  flash_fwd_hdim128_bf16_sm90.o   3.00 GB peak" in report
    assert "largest nvcc job 3.00 GB peak" in report
    assert bs.parse_compile_log(tmp_path / "absent") == {}


def test_torch_target_version_flag_matches_torch_headers():
    assert bs.torch_target_version_flag("2.11") == "-DTORCH_TARGET_VERSION=0x020b000000000000"
    assert bs.torch_target_version_flag("2.9") == "-DTORCH_TARGET_VERSION=0x0209000000000000"  # version.h's example
    assert bs.version_tuple("2.14.1+cu130") == (2, 14) and bs.version_tuple("2.11.0a0+git") == (2, 11)


def test_binding_uses_only_torch_stable_abi():
    """csrc/flash_api.cpp includes no ATen / c10 / torch/library.h header: the stable ABI only."""
    source = (REPO_ROOT / "csrc" / "flash_api.cpp").read_text()
    includes = re.findall(r"^#include [<\"]([^>\"]+)[>\"]", source, re.MULTILINE)
    torch_includes = [i for i in includes if i.startswith(("ATen/", "c10/", "torch/"))]
    assert torch_includes and all(i.startswith(("torch/csrc/stable/", "torch/headeronly/",
                                                "torch/csrc/inductor/aoti_torch/c/")) for i in torch_includes)
    assert "STABLE_TORCH_LIBRARY(" in source and "TORCH_BOX(" in source
    for unstable in ("at::", "c10::", "TORCH_CHECK(", "TORCH_LIBRARY("):
        assert unstable not in source.replace("STABLE_TORCH_LIBRARY(", ""), unstable


def test_measure_compile_logs_and_keeps_the_exit_code(tmp_path):
    log = tmp_path / "log.tsv"
    script = REPO_ROOT / "tools" / "build" / "measure_compile.py"
    # location: checkout (the children import no flash_attn_hopper)
    ok = subprocess.run([sys.executable, str(script), str(log), "--", sys.executable, "-c",
                         "x = bytearray(64 << 20)", "-o", "out.o"], capture_output=True, text=True, timeout=120)
    bad = subprocess.run([sys.executable, str(script), str(log), "--", sys.executable, "-c",  # location: checkout
                          "raise SystemExit(3)", "-o", "bad.o"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and bad.returncode == 3
    lines = [line.split("\t") for line in log.read_text().splitlines()]
    assert [line[0] for line in lines] == ["out.o", "bad.o"] and lines[1][3] == "3"
    assert int(lines[0][2]) >= 64 * 1024  # KiB: the child's 64 MiB shows in its peak
    assert bs.measuring_nvcc("/cuda/bin/nvcc", Path("/b/log"), "/py").endswith(" -- /cuda/bin/nvcc")


_FAILED_LOAD = """
import sys, importlib.abc
class _Refuse(importlib.abc.MetaPathFinder):  # as a torch without the stable-ABI symbols would
    def find_spec(self, name, path, target=None):
        if name == "flash_attn_hopper._C":
            raise ImportError("undefined symbol: torch_dtype_float8_e8m0fnu")
sys.meta_path.insert(0, _Refuse())
import flash_attn_hopper
print("REASON:", flash_attn_hopper.unavailable_reason())
"""


def test_a_torch_outside_the_range_is_refused_with_the_range():
    """An extension that cannot load (an older torch lacks stable-ABI symbols) is refused, not a
    crash: the package imports and says which torch it needs."""
    from helpers import location

    proc = location.run_python(["-c", _FAILED_LOAD], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "undefined symbol: torch_dtype_float8_e8m0fnu" in proc.stdout
    assert f"needs torch >= {flash_attn_hopper._version.TORCH_MIN_VERSION}" in proc.stdout
