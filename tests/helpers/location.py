"""Which copy of flash_attn_hopper the tests import, and child processes that import the same one.

After ``pip install .`` the README's ``pytest tests -q -rs`` runs from the repository root, which
holds the source tree of the package: a copy without the compiled extension ``_C``. pytest (the
executable, default import mode) puts ``tests/`` on ``sys.path``, not the root, so the tests
import the installed package. Two things can still pick up the source tree instead:

- a child process started as ``python -c ...`` or ``python -m ...`` with the root as its working
  directory: Python puts the working directory first on the child's ``sys.path``;
  :func:`run_python` starts children outside the checkout with the parent's package first on
  ``PYTHONPATH``, so a child imports exactly the copy its test imported;
- ``python -m pytest`` from the root (the root lands on ``sys.path``); conftest refuses such a
  session with :func:`shadowing_problem`'s message when an installed copy has the extension and the
  imported one has none.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE = "flash_attn_hopper"
#: The compiled extension's file name: _C.so, _C.cpython-311-x86_64-linux-gnu.so, _C.abi3.so, _C.pyd.
EXTENSION_FILE = re.compile(r"^_C(\.[A-Za-z0-9_.-]+)?\.(so|pyd)$")


def imported_package_dir() -> Path:
    """The folder of the flash_attn_hopper that ``import flash_attn_hopper`` picks in this process."""
    module = sys.modules.get(PACKAGE)
    if module is not None and getattr(module, "__file__", None):
        return Path(module.__file__).resolve().parent
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ImportError(f"{PACKAGE} is not importable")
    return Path(spec.origin).resolve().parent


def extension_files(package_dir: Path) -> list[Path]:
    """The compiled extensions in ``package_dir`` (an in-place build or an installed wheel)."""
    if not package_dir.is_dir():
        return []
    return sorted(p for p in package_dir.iterdir() if EXTENSION_FILE.match(p.name))


def installed_extensions() -> list[Path]:
    """The ``_C`` of every flash_attn_hopper installed from a wheel (``pip install .`` or a
    downloaded wheel), found through the installed metadata (RECORD), without importing it.

    An editable install or an in-place build lists no ``_C`` in a RECORD and gives none here.
    """
    found = []
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("-", "_")
        if name != PACKAGE:
            continue
        for file in dist.files or []:
            parts = Path(str(file)).parts
            if len(parts) == 2 and parts[0] == PACKAGE and EXTENSION_FILE.match(parts[1]):
                path = Path(dist.locate_file(file)).resolve()
                if path.is_file() and path not in found:
                    found.append(path)
    return found


def shadowing_problem(package_dir: Path, installed: list[Path]) -> str | None:
    """Why a test session importing ``package_dir`` would not test the installed build; None if it does.

    The installed package is what the tests must see after ``pip install .``. A copy elsewhere that
    has an extension of its own (``python setup.py build_ext --inplace``) is a deliberate choice and
    passes; one without (the source tree of a checkout) would turn every GPU test into a skip and
    every child process into an import of code that cannot run.
    """
    if not installed or any(ext.parent == package_dir for ext in installed):
        return None
    if extension_files(package_dir):
        return None
    return (
        f"the tests import {PACKAGE} from {package_dir}, which has no compiled extension, while the installed "
        f"package at {installed[0].parent} has one ({installed[0].name}): the source tree shadows the installed "
        "package. Run the tests with the `pytest` executable as the README says (`pytest tests -q -rs`), not "
        "`python -m pytest`, which puts the working directory first on sys.path; or build in place with "
        "`python setup.py build_ext --inplace` to test the source tree"
    )


def describe(package_dir: Path, installed: list[Path]) -> str:
    """One line for pytest's header: which copy the tests import and whether it has the extension."""
    exts = extension_files(package_dir)
    if any(ext.parent == package_dir for ext in installed):
        kind = f"installed, extension {exts[0].name}" if exts else "installed"
    elif exts:
        kind = f"in-place build, extension {exts[0].name}"
    else:
        kind = "no compiled extension"
    return f"{PACKAGE}: {package_dir} ({kind})"


def child_env(env: dict | None = None) -> dict:
    """``env`` (default: os.environ) with the folder holding the package under test first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    root = str(imported_package_dir().parent)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    env["PYTHONPATH"] = os.pathsep.join([root, *rest])
    env.pop("PYTHONSTARTUP", None)
    return env


def run_python(args: list[str], cwd: str | os.PathLike | None = None, env: dict | None = None,
               **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *args])`` in a child that imports the tests' flash_attn_hopper.

    It runs in ``cwd`` when given (which must lie outside the checkout), else in a fresh temporary
    folder, so ``-c`` and ``-m`` put no checkout on its sys.path; ``capture_output`` and ``text``
    default to True.
    """
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    child = child_env(env)
    if cwd is not None:
        return subprocess.run([sys.executable, *args], cwd=cwd, env=child, **kwargs)
    with tempfile.TemporaryDirectory(prefix="fah-child-") as tmp:
        return subprocess.run([sys.executable, *args], cwd=tmp, env=child, **kwargs)
