"""Build helpers for setup.py that need no torch: toolkit and CUTLASS discovery,
the compiler flags, MAX_JOBS sizing, the per-file compile-time report and the
build-config file written into the package.

Kept apart from setup.py so the CPU tests can check them without building.
"""

from __future__ import annotations

import importlib.util
import os
import pprint
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: The largest nvcc job measured peaks at 3.25 GB resident (flash_fwd_hdim256_bf16; hdim128 fwd 3.13,
#: bwd 2.25-2.55 GB; nvcc 13.0, CUTLASS 4.2, tools/build/measure_compile.py on the 2-core CI machine).
#: The default budgets 1.5x that, so a 24 GiB, 2-core machine runs 2 jobs only with >= 10 GB free.
MEASURED_PEAK_GB_PER_JOB = 3.25
GB_PER_COMPILE_JOB = 5.0

NVCC_FLAGS = [
    "-gencode=arch=compute_90a,code=sm_90a",  # the "a" target: WGMMA and setmaxnreg need it
    "-O3",
    "-std=c++20",  # torch >= 2.13 headers require C++20
    "-DNDEBUG",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--use_fast_math",
    # torch's extension builder defines these; CUTLASS needs the operators back.
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
    # CuTe's TMA descriptors call cuTensorMapEncodeTiled, which csrc/launch/driver.cu resolves once,
    # instead of looking the driver entry point up on every descriptor.
    "-DCUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL",
    "-lineinfo",
]
NVCC_VERBOSE_FLAGS = ["-Xptxas=-v"]
CXX_FLAGS = ["-O3", "-std=c++20"]
ENV_VERBOSE_PTXAS = "FLASH_ATTN_HOPPER_VERBOSE_PTXAS"
#: Developer builds: flags appended to nvcc's (shell-split), e.g. "-DFLASH_FWD_DEV_X=1 -Xptxas=-warn-spills".
ENV_EXTRA_NVCC_FLAGS = "FLASH_ATTN_HOPPER_EXTRA_NVCC_FLAGS"


def extra_nvcc_flags(env=None) -> list[str]:
    env = os.environ if env is None else env
    return shlex.split(env.get(ENV_EXTRA_NVCC_FLAGS, ""))


def nvcc_flags(env=None) -> list[str]:
    env = os.environ if env is None else env
    verbose = env.get(ENV_VERBOSE_PTXAS, "").strip().lower() in ("1", "true", "yes", "on")
    return NVCC_FLAGS + (NVCC_VERBOSE_FLAGS if verbose else []) + extra_nvcc_flags(env)


def cxx_flags(env=None) -> list[str]:
    """CXX_FLAGS plus the macro definitions (-D / -U) among the extra nvcc flags: the binding
    (flash_api.cpp, compiled by the host compiler) sees the same developer macros as the kernels."""
    extra = extra_nvcc_flags(env)
    macros = []
    for i, flag in enumerate(extra):
        if flag in ("-D", "-U") and i + 1 < len(extra):
            macros += [flag, extra[i + 1]]
        elif flag.startswith(("-D", "-U")) and len(flag) > 2:
            macros.append(flag)
    return CXX_FLAGS + macros


# --------------------------------------------------------------------------
# CUDA toolkit
# --------------------------------------------------------------------------


def is_cuda_toolkit(root: str | os.PathLike | None) -> bool:
    if not root:
        return False
    root = Path(root)
    return (root / "bin" / "nvcc").is_file() and (root / "include" / "cuda_runtime.h").is_file()


def nvcc_reported_home(nvcc: str = "nvcc") -> str | None:
    """The toolkit root an nvcc on PATH really runs from.

    Wrappers such as a /usr/local/bin/nvcc script that execs the real one
    fool torch's guess (dirname of dirname of `which nvcc`); nvcc's own
    --dryrun prints the directory it lives in as ``_HERE_``.
    """
    if shutil.which(nvcc) is None:
        return None
    try:
        proc = subprocess.run(
            [nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"^#\$ _HERE_=(.+)$", proc.stdout + proc.stderr, re.MULTILINE)
    if not match:
        return None
    home = str(Path(match.group(1).strip()).resolve().parent)
    return home if is_cuda_toolkit(home) else None


def resolve_cuda_home(env=None) -> tuple[str | None, str]:
    """(toolkit root, how it was found); root None when nothing usable was found."""
    env = os.environ if env is None else env
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            if is_cuda_toolkit(env[var]):
                return env[var], f"${var}"
            return None, (
                f"${var}={env[var]} is not a CUDA toolkit root (no bin/nvcc and include/cuda_runtime.h there)"
            )
    reported = nvcc_reported_home()
    if reported:
        return reported, "the nvcc on PATH (nvcc --dryrun)"
    for candidate in ("/usr/local/cuda",):
        if is_cuda_toolkit(candidate):
            return candidate, candidate
    return None, "no nvcc on PATH and no /usr/local/cuda"


# --------------------------------------------------------------------------
# CUTLASS
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class CutlassLocation:
    root: Path  # has include/cutlass and tools/util/include
    origin: str  # how it was chosen, for the build log and build_info()

    @property
    def include_dirs(self) -> list[str]:
        return [str(self.root / "include"), str(self.root / "tools" / "util" / "include")]

    def version(self) -> str | None:
        header = self.root / "include" / "cutlass" / "version.h"
        if not header.is_file():
            return None
        text = header.read_text(errors="replace")
        parts = [re.search(rf"#define CUTLASS_{key} (\d+)", text) for key in ("MAJOR", "MINOR", "PATCH")]
        return ".".join(m.group(1) for m in parts) if all(parts) else None


def _has_cutlass_headers(root: Path) -> bool:
    return (root / "include" / "cutlass" / "cutlass.h").is_file() and (root / "include" / "cute").is_dir()


def find_cutlass(repo_root: Path, env=None) -> CutlassLocation:
    """$CUTLASS_HOME, else third_party/cutlass, else the nvidia-cutlass package's headers."""
    env = os.environ if env is None else env
    if env.get("CUTLASS_HOME"):
        root = Path(env["CUTLASS_HOME"]).expanduser().resolve()
        if not _has_cutlass_headers(root):
            raise RuntimeError(
                f"CUTLASS_HOME={env['CUTLASS_HOME']} has no include/cutlass/cutlass.h and include/cute/: "
                "point it at a CUTLASS checkout, or unset it to use the nvidia-cutlass package"
            )
        return CutlassLocation(root, "$CUTLASS_HOME")
    checkout = repo_root / "third_party" / "cutlass"
    if _has_cutlass_headers(checkout):
        return CutlassLocation(checkout.resolve(), "third_party/cutlass")
    spec = importlib.util.find_spec("cutlass_library")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            root = Path(location) / "source"
            if _has_cutlass_headers(root):
                return CutlassLocation(root.resolve(), "the nvidia-cutlass package")
    raise RuntimeError(
        "CUTLASS headers not found: run `pip install nvidia-cutlass` "
        "(or set CUTLASS_HOME to a CUTLASS checkout, or clone one into third_party/cutlass)"
    )


# --------------------------------------------------------------------------
# Parallelism
# --------------------------------------------------------------------------


def available_memory_gb(meminfo: str = "/proc/meminfo") -> float | None:
    try:
        text = Path(meminfo).read_text()
    except OSError:
        return None
    match = re.search(r"^MemAvailable:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(match.group(1)) / (1024 * 1024) if match else None


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_max_jobs(cores: int, mem_gb: float | None, n_sources: int) -> tuple[int, str]:
    """(jobs, why): one job per core, at most one per GB_PER_COMPILE_JOB of free memory."""
    jobs = max(1, cores)
    why = f"{cores} cores"
    if mem_gb is not None:
        by_memory = max(1, int(mem_gb // GB_PER_COMPILE_JOB))
        why += f", {mem_gb:.0f} GB available at ~{GB_PER_COMPILE_JOB:.0f} GB per job"
        jobs = min(jobs, by_memory)
    if n_sources > 0 and jobs > n_sources:
        jobs = n_sources
        why += f", {n_sources} files"
    return jobs, why


# --------------------------------------------------------------------------
# Compile-time report
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class CompileRecord:
    output: str
    seconds: float


def parse_ninja_log(path: Path, start_offset: int = 0) -> list[CompileRecord]:
    """Per-output compile times from a ninja log (format v5/v6), longest first.

    Lines are ``start_ms<TAB>end_ms<TAB>mtime<TAB>output<TAB>hash``; the last
    line for an output wins.  Ninja appends one block per run, so passing the
    log's size before a build as ``start_offset`` reports only that build
    (unless ninja recompacted the log meanwhile, then everything is read).
    """
    try:
        data = Path(path).read_bytes()
    except OSError:
        return []
    if 0 < start_offset <= len(data):
        data = data[start_offset:]
    records: dict[str, CompileRecord] = {}
    for line in data.decode(errors="replace").splitlines():
        fields = line.split("\t")
        if line.startswith("#") or len(fields) < 4:
            continue
        try:
            start, end = int(fields[0]), int(fields[1])
        except ValueError:
            continue
        records[fields[3]] = CompileRecord(fields[3], (end - start) / 1000.0)
    return sorted(records.values(), key=lambda r: -r.seconds)


def parse_compile_log(path: Path) -> dict[str, float]:
    """Peak resident memory in GB per output file name, from tools/build/measure_compile.py's log
    (``output<TAB>seconds<TAB>peak_kib<TAB>exit``); the last line for an output wins."""
    peaks: dict[str, float] = {}
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return peaks
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) < 3:
            continue
        try:
            peaks[Path(fields[0]).name] = int(fields[2]) / (1024 * 1024)
        except ValueError:
            continue
    return peaks


def format_compile_report(
    records: list[CompileRecord], wall_seconds: float, jobs: int, peak_gb: dict[str, float] | None = None
) -> str:
    """The per-file report: seconds, and the nvcc job's peak memory where it was measured."""
    peak_gb = peak_gb or {}
    lines = [f"flash_attn_hopper: compiled {len(records)} file(s) in {wall_seconds:.1f} s wall with {jobs} job(s)"]
    for record in records:
        name = Path(record.output).name
        memory = f"  {peak_gb[name]:5.2f} GB peak" if name in peak_gb else ""
        lines.append(f"  {record.seconds:8.1f} s  {name}{memory}")
    if peak_gb:
        lines.append(f"flash_attn_hopper: largest nvcc job {max(peak_gb.values()):.2f} GB peak resident memory "
                     f"(MAX_JOBS default budgets {GB_PER_COMPILE_JOB:.1f} GB per job)")
    return "\n".join(lines)


def measuring_nvcc(nvcc_command: str, log: Path, python: str) -> str:
    """A PYTORCH_NVCC value that runs ``nvcc_command`` through tools/build/measure_compile.py."""
    script = Path(__file__).resolve().parent / "measure_compile.py"
    return " ".join(shlex.quote(str(a)) for a in (python, script, log, "--")) + " " + nvcc_command


#: The Python stable ABI the extension module targets (Py_LIMITED_API): one abi3 wheel for every
#: Python from this version on.
PY_LIMITED_API = "cp310"


def torch_target_version_flag(min_version: str) -> str:
    """-DTORCH_TARGET_VERSION=0x020b000000000000 for "2.11": the torch stable-ABI version the
    binding is compiled for (torch/csrc/stable/version.h: major << 56 | minor << 48)."""
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", min_version).groups())
    return f"-DTORCH_TARGET_VERSION=0x{(major << 56) | (minor << 48):016x}"


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:2])


def same_minor_requirement(torch_version: str) -> str:
    """">=2.14,<2.15" for torch "2.14.1+cu130": the torch versions an extension built against
    torch's (unstable) C++ ABI loads under."""
    match = re.match(r"(\d+)\.(\d+)", torch_version)
    if not match:
        return f"=={torch_version}"
    major, minor = int(match.group(1)), int(match.group(2))
    return f">={major}.{minor},<{major}.{minor + 1}"


# --------------------------------------------------------------------------
# Build config written into the package
# --------------------------------------------------------------------------


def render_build_config(config: dict) -> str:
    return (
        '"""Written by setup.py at build time -- do not edit; see flash_attn_hopper.build_info()."""\n\n'
        f"CONFIG = {pprint.pformat(config, sort_dicts=False, width=100)}\n"
    )


def write_build_config(config: dict, *targets: Path) -> None:
    text = render_build_config(config)
    for target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
