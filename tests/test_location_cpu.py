"""The tests import the installed package, and so do their child processes (issue 44, item 4).

After ``pip install .`` the repository root holds a source tree without the compiled extension;
a test or a child process that imported it would test nothing (every GPU test skips, every child
fails to load ``_C``). These checks fail if that happens.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import flash_attn_hopper
from conftest import REPO_ROOT
from helpers import location

_IMPORTED = Path(flash_attn_hopper.__file__).resolve().parent


def test_the_tests_import_the_installed_build_when_there_is_one():
    """When a wheel with the extension is installed, its copy is the one imported here, not the checkout's."""
    installed = location.installed_extensions()
    if installed:
        assert _IMPORTED in [ext.parent for ext in installed] or location.extension_files(_IMPORTED), (
            location.shadowing_problem(_IMPORTED, installed)
        )
    assert location.imported_package_dir() == _IMPORTED
    if installed and _IMPORTED in [ext.parent for ext in installed]:
        assert not _IMPORTED.is_relative_to(REPO_ROOT)


@pytest.mark.parametrize("flag", ["-c", "-m"])
def test_children_import_the_package_the_tests_import(flag, monkeypatch):
    """Even started while the working directory is the repository root (where `python -c` alone would
    import the source tree), a child imports the tests' copy of flash_attn_hopper."""
    monkeypatch.chdir(REPO_ROOT)
    code = "import flash_attn_hopper, os; print(os.path.dirname(os.path.realpath(flash_attn_hopper.__file__)))"
    if flag == "-c":
        proc = location.run_python(["-c", code], timeout=300)
    else:
        proc = location.run_python(["-m", "flash_attn_hopper", "--help"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    if flag == "-c":
        assert Path(proc.stdout.strip()) == _IMPORTED


def test_shadowing_is_refused_and_in_place_builds_pass(tmp_path):
    site = tmp_path / "site-packages" / "flash_attn_hopper"
    tree = tmp_path / "checkout" / "flash_attn_hopper"
    for d in (site, tree):
        d.mkdir(parents=True)
        (d / "__init__.py").write_text("")
    ext = site / "_C.cpython-311-x86_64-linux-gnu.so"
    ext.write_bytes(b"")
    assert location.shadowing_problem(site, [ext]) is None
    assert location.shadowing_problem(tree, []) is None  # nothing installed: a source checkout is all there is
    problem = location.shadowing_problem(tree, [ext])
    assert problem and str(tree) in problem and "pytest tests -q -rs" in problem and "python -m pytest" in problem
    (tree / "_C.abi3.so").write_bytes(b"")  # an in-place build: a deliberate choice
    assert location.shadowing_problem(tree, [ext]) is None
    assert "in-place build" in location.describe(tree, [ext])
    assert "installed" in location.describe(site, [ext])


@pytest.mark.parametrize("name, is_ext", [
    ("_C.so", True), ("_C.cpython-311-x86_64-linux-gnu.so", True), ("_C.abi3.so", True), ("_C.pyd", True),
    ("_C.py", False), ("_Cx.so", False), ("_build_config.py", False),
])
def test_extension_file_names(name, is_ext):
    assert bool(location.EXTENSION_FILE.match(name)) == is_ext


def test_no_test_starts_python_children_around_the_helper():
    """`python -c` / `python -m` children go through location.run_python; scripts run by path are fine
    (their own folder, not the working directory, heads their sys.path). A child that imports no
    flash_attn_hopper says so with a `# location: checkout` comment on its line or the one above."""
    offenders = []
    for path in sorted((REPO_ROOT / "tests").rglob("*.py")):
        if path.name == "location.py":
            continue
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if not re.search(r"sys\.executable\s*,\s*(?:\*\w+\s*,\s*)?[\"'](-c|-m)[\"']", line):
                continue
            if "location: checkout" in line or (i > 0 and "location: checkout" in lines[i - 1]):
                continue
            offenders.append(f"{path.relative_to(REPO_ROOT)}:{i + 1}")
    assert not offenders, f"python children started without helpers.location.run_python: {offenders}"


def test_sys_path_has_no_checkout_ahead_of_the_installed_package():
    if not location.installed_extensions():
        pytest.skip("no installed wheel with the extension: the checkout is the package under test")
    first = next((Path(p or ".").resolve() for p in sys.path
                  if (Path(p or ".") / "flash_attn_hopper" / "__init__.py").is_file()), None)
    assert first == _IMPORTED.parent
