"""Build flash_attn_hopper's CUDA extension against the torch already installed.

    pip install --no-build-isolation -v .          (or tools/build/build_wheel.sh for a wheel)

The binding (csrc/flash_api.cpp) uses only torch's stable ABI, compiled for the oldest supported
torch (TORCH_MIN_VERSION in flash_attn_hopper/_version.py, passed as TORCH_TARGET_VERSION), and
Python's limited API: the result is one abi3 module that loads under every torch from that
version on and every Python >= 3.10. `sdist`, `egg_info` and `dist_info` need neither torch nor
a toolkit.

Knobs (see flash_attn_hopper/manifest.py): FLASH_ATTN_HOPPER_HDIMS=64,128,
FLASH_ATTN_HOPPER_DTYPES=bf16, FLASH_ATTN_HOPPER_DISABLE_BACKWARD=1 (no backward
kernels; they are built by default), FLASH_ATTN_HOPPER_DISABLE_SOFTCAP=1 (no softcap kernels), MAX_JOBS=N, CUDA_HOME=<toolkit root>, CUTLASS_HOME=<cutlass checkout>,
FLASH_ATTN_HOPPER_VERBOSE_PTXAS=1 (register/spill report per kernel),
FLASH_ATTN_HOPPER_EXTRA_NVCC_FLAGS="-DKEY=VALUE ..." (developer builds: appended to nvcc's
flags; its -D/-U macros reach the binding too; see tools/README.md).
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools" / "build"))

import build_support  # noqa: E402  (tools/build/, needs no torch)
import generate_instantiations  # noqa: E402

manifest = generate_instantiations.load_manifest(ROOT)


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def say(message: str) -> None:
    print(f"flash_attn_hopper: {message}", flush=True)


def read_version() -> str:
    """flash_attn_hopper/_version.py's __version__ (the one place it is set), plus the local label
    $FLASH_ATTN_HOPPER_LOCAL_VERSION when given (tools/build/build_wheel.sh --local-version)."""
    text = (ROOT / "flash_attn_hopper" / "_version.py").read_text()
    version = re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE).group(1)
    local = os.environ.get(ENV_LOCAL_VERSION, "").strip()
    if local:
        if not re.fullmatch(r"[a-z0-9]+(\.[a-z0-9]+)*", local):
            fail(f"{ENV_LOCAL_VERSION}={local!r}: a local version label is lower-case letters, digits and dots")
        version += "+" + local
    return version


ENV_LOCAL_VERSION = "FLASH_ATTN_HOPPER_LOCAL_VERSION"
#: Commands that only describe or pack the sources (the sdist and the metadata pip asks for first):
#: they need no torch, toolkit or CUTLASS, so `python -m build --sdist` works anywhere.
METADATA_COMMANDS = {"sdist", "egg_info", "dist_info", "check"}
BUILD_COMMANDS = {"build", "build_ext", "build_py", "bdist_wheel", "install", "develop", "editable_wheel", "bdist"}
_words = [a for a in sys.argv[1:] if not a.startswith("-")]
METADATA_ONLY = bool(_words) and _words[0] in METADATA_COMMANDS and not BUILD_COMMANDS.intersection(_words)

if METADATA_ONLY:
    from setuptools import setup

    setup(version=read_version())
else:  # build the extension (the rest of this file)
    try:
        import torch
    except ImportError:
        fail(
            "PyTorch is not importable in this build environment. Fix: `pip install torch`, then build against it with "
            "`pip install --no-build-isolation -v .` (build isolation hides the installed torch)."
        )

    # torch.utils.cpp_extension fixes CUDA_HOME when it is imported: settle it first.
    cuda_home, cuda_origin = build_support.resolve_cuda_home()
    if cuda_home is None:
        fail(f"no usable CUDA toolkit ({cuda_origin}). Fix: export CUDA_HOME=<toolkit root holding bin/nvcc>, "
             "e.g. export CUDA_HOME=/usr/local/cuda-13.0")
    os.environ["CUDA_HOME"] = cuda_home

    from setuptools import setup  # noqa: E402
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension  # noqa: E402

    try:
        selection = manifest.selection_from_env()
    except ValueError as err:
        fail(str(err))

    try:
        cutlass = build_support.find_cutlass(ROOT)
    except RuntimeError as err:
        fail(str(err))

    missing = generate_instantiations.missing_launch_headers(selection, ROOT / "csrc")
    if missing:
        fail(
            f"the selected directions ({', '.join(selection.directions)}) need {', '.join('csrc/' + m for m in missing)}, "
            f"which this checkout lacks. Fix: set {manifest.ENV_DISABLE_BACKWARD}=1 to build the forward only."
        )
    generated = generate_instantiations.generate(selection, ROOT / "csrc" / "generated")
    binding = ROOT / "csrc" / "flash_api.cpp"
    if not binding.is_file():
        fail(f"{binding.relative_to(ROOT)} is missing: this checkout has no torch binding to build")
    # The binding, the split-KV combine kernel (no template sweep), the TMA descriptors' driver entry
    # point and the generated kernel files.
    sources = [str(binding.relative_to(ROOT)), "csrc/launch/combine.cu", "csrc/launch/driver.cu"] + [
        str(p.relative_to(ROOT)) for p in generated.sources
    ]
    # The binding uses torch's stable ABI only, compiled for the oldest torch supported: the
    # extension then loads under every torch from that version on (and Python's limited API: abi3).
    TORCH_MIN_VERSION = re.search(
        r'^TORCH_MIN_VERSION = "([^"]+)"', (ROOT / "flash_attn_hopper" / "_version.py").read_text(), re.MULTILINE
    ).group(1)
    if build_support.version_tuple(torch.__version__) < build_support.version_tuple(TORCH_MIN_VERSION):
        fail(f"torch {torch.__version__} is older than {TORCH_MIN_VERSION}, the oldest torch whose stable ABI the "
             f"binding targets. Fix: `pip install 'torch>={TORCH_MIN_VERSION}'`")
    NVCC_FLAGS = build_support.nvcc_flags()
    CXX_FLAGS = build_support.cxx_flags() + [build_support.torch_target_version_flag(TORCH_MIN_VERSION)]


    def nvcc_version() -> str | None:
        try:
            out = subprocess.run(
                [str(Path(cuda_home) / "bin" / "nvcc"), "--version"], capture_output=True, text=True, timeout=60
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        match = re.search(r"release [\d.]+, V([\d.]+)", out)
        return match.group(1) if match else None


    def default_nvcc_command() -> str:
        """The nvcc command torch's extension builder would write into build.ninja (with ccache/sccache
        in front when it finds one)."""
        nvcc = str(Path(cuda_home) / "bin" / "nvcc")
        try:
            from torch.utils.cpp_extension import _wrap_compiler  # private; absent in some torch versions

            return " ".join(shlex.quote(part) for part in _wrap_compiler(nvcc))
        except (ImportError, TypeError):
            return shlex.quote(nvcc)


    class FlashBuildExtension(BuildExtension):
        """BuildExtension that sizes MAX_JOBS, reports per-file compile times and
        records the build configuration into the package."""

        def run(self):
            # setuptools clears self.inplace while it builds and copies the result into the source
            # tree afterwards: remember where the _C will end up.
            self._into_source_tree = bool(self.inplace) or bool(getattr(self, "editable_mode", False))
            super().run()

        def build_extensions(self):
            if os.environ.get("MAX_JOBS"):
                jobs, why = int(os.environ["MAX_JOBS"]), "from $MAX_JOBS"
            else:
                jobs, why = build_support.default_max_jobs(
                    build_support.cpu_count(), build_support.available_memory_gb(), len(sources)
                )
                os.environ["MAX_JOBS"] = str(jobs)  # BuildExtension passes it to ninja -j
            say(
                f"compiling {len(sources)} file(s) with MAX_JOBS={jobs} ({why}); "
                f"instantiations: {', '.join(inst.filename for inst in selection.instantiations()) or 'none'}"
            )
            say(f"CUDA {cuda_home} (via {cuda_origin}); CUTLASS {cutlass.version()} from {cutlass.origin}: {cutlass.root}")
            extra = build_support.extra_nvcc_flags()
            if extra:
                say(f"extra nvcc flags from ${build_support.ENV_EXTRA_NVCC_FLAGS}: {' '.join(extra)}")
            ninja_log = Path(self.build_temp) / ".ninja_log"
            log_offset = ninja_log.stat().st_size if ninja_log.is_file() else 0
            # Each nvcc job runs through tools/build/measure_compile.py, which logs its peak memory.
            memory_log = Path(self.build_temp).resolve() / "compile_memory.tsv"
            memory_log.parent.mkdir(parents=True, exist_ok=True)
            memory_log.write_text("")
            own_nvcc = "PYTORCH_NVCC" not in os.environ
            if own_nvcc:
                os.environ["PYTORCH_NVCC"] = build_support.measuring_nvcc(default_nvcc_command(), memory_log, sys.executable)
            start = time.time()
            try:
                super().build_extensions()
            finally:
                if own_nvcc:
                    del os.environ["PYTORCH_NVCC"]
            wall = time.time() - start

            records = build_support.parse_ninja_log(ninja_log, log_offset) if ninja_log.is_file() else []
            peak_gb = build_support.parse_compile_log(memory_log)
            print(build_support.format_compile_report(records, wall, jobs, peak_gb), flush=True)
            config = {
                "version": read_version(),
                "selection": selection.as_dict(),
                "compiled": [
                    {"direction": inst.direction, "hdim": inst.hdim, "dtype": inst.dtype}
                    for inst in selection.instantiations()
                ],
                "torch_version": torch.__version__,
                # Torch's stable ABI, targeted at TORCH_MIN_VERSION: every torch from that one on.
                "torch_requirement": f">={TORCH_MIN_VERSION}",
                "torch_abi": f"stable ABI (TORCH_TARGET_VERSION {TORCH_MIN_VERSION}) and Python's limited API "
                             f"({build_support.PY_LIMITED_API})",
                "torch_cuda_version": torch.version.cuda,
                "nvcc_version": nvcc_version(),
                "cuda_home": cuda_home,
                "cutlass_version": cutlass.version(),
                "cutlass_origin": cutlass.origin,
                "cutlass_path": str(cutlass.root),
                "nvcc_flags": NVCC_FLAGS,
                "cxx_flags": CXX_FLAGS,
                "max_jobs": jobs,
                "build_seconds": round(wall, 1),
                "compile_seconds": {Path(r.output).name: r.seconds for r in records},
                "compile_peak_gb": {name: round(gb, 2) for name, gb in peak_gb.items()},
                "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "python_version": platform.python_version(),
            }
            # Next to the _C it describes: the source tree for in-place/editable builds, else the wheel's tree.
            targets = [Path(self.build_lib) / "flash_attn_hopper" / "_build_config.py"]
            if getattr(self, "_into_source_tree", False):
                targets.append(ROOT / "flash_attn_hopper" / "_build_config.py")
            build_support.write_build_config(config, *targets)
            say(f"build configuration written to {', '.join(str(t) for t in targets)}")


    setup(
        version=read_version(),
        ext_modules=[
            CUDAExtension(
                name="flash_attn_hopper._C",
                sources=sources,
                include_dirs=[str(ROOT / "csrc"), *cutlass.include_dirs, str(Path(cuda_home) / "include" / "cccl")],
                extra_compile_args={"cxx": CXX_FLAGS, "nvcc": NVCC_FLAGS},
                py_limited_api=True,
            )
        ],
        options={"bdist_wheel": {"py_limited_api": build_support.PY_LIMITED_API}},
        cmdclass={"build_ext": FlashBuildExtension.with_options(use_ninja=True)},
    )
