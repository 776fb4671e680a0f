#!/usr/bin/env python3
"""Build FlashAttention-3 as a benchmark peer on the GPU machine (it has no network).

FA3 is not part of this package and none of its code is in this repository. `pack` (run here,
where the mirrors are) writes two archives into .peers/ (git-ignored): FA3's hopper/ sources at
one upstream commit (the one shared/BENCHMARKS.md measured, 0251105) and the CUTLASS headers that
commit pins as its submodule (7127592, CUTLASS 4.3.4+; the nvidia-cutlass wheel we build with is
4.2). A device call carries .peers/; `build` there unpacks them and compiles bf16 forward +
backward for head dims 64 / 128 / 256 with FA3's own nvcc flags and with the features the
yardstick's build left out compiled out too (varlen, split-KV, paged KV, append-KV, local,
softcap, PackGQA, fp16, fp8, sm80), then lays out a directory which, on PYTHONPATH, makes
`flash_attn_interface` importable: benchmarks/benchmark_attn.py's `fa3` provider then runs.
`build --enable SOFTCAP,VARLEN` compiles those features back in (the peers of issues that compare
them: benchmarks/benchmark_scoremods.py's fa3-softcap, benchmark_varlen.py's fa3-varlen); the
decode peer (benchmark_decode.py's fa3 at its best) is `--enable SPLIT,PAGEDKV,PACKGQA,VARLEN,APPENDKV
--hdims 128`, exported to .peers/fa3decode.

    python3 tools/gpu/fa3_peer.py pack --fa-repo /work/.mirror/Dao-AILab+flash-attention/repo \\
        --cutlass-repo /work/.mirror/NVIDIA+cutlass/repo            # here, once
    python3 tools/gpu/fa3_peer.py build --out /tmp/fa3peer              # on the GPU machine
    PYTHONPATH=/tmp/fa3peer python3 benchmarks/benchmark_attn.py --providers flash_attn_hopper,fa3

`build` also runs on the CPU machine (CUDA_HOME set; ~4 min on 2 cores with --enable VARLEN), and
`export` copies the four files a peer needs (16 MB) into .peers/fa3built, which tools/gpu/run.sh's
fa3 step then uses as it is, at no device time:

    CUDA_HOME=/usr/local/cuda-13.0 python3 tools/gpu/fa3_peer.py build --out /tmp/fa3peer --jobs 2 --enable VARLEN
    python3 tools/gpu/fa3_peer.py export /tmp/fa3peer                   # -> .peers/fa3built
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PEERS = REPO_ROOT / ".peers"
FA3_COMMIT = "0251105"
CUTLASS_COMMIT = "7127592069c2fe01b041e174ba4345ef9b279671"
FA3_ARCHIVE = PEERS / f"fa3-hopper-{FA3_COMMIT}.tar.gz"
CUTLASS_ARCHIVE = PEERS / f"cutlass-include-{CUTLASS_COMMIT[:7]}.tar.gz"
HDIMS = (64, 128, 256)  # the default build
BUILDABLE_HDIMS = (64, 128, 192, 256)  # 192's files come from FA3's own generate_kernels.py at build time

# FA3's setup.py switches, as the yardstick's build set them (BENCHMARKS.md): True = compiled out.
DISABLED = {
    "BACKWARD": False, "SPLIT": True, "PAGEDKV": True, "APPENDKV": True, "LOCAL": True,
    "SOFTCAP": True, "PACKGQA": True, "FP16": True, "FP8": True, "VARLEN": True, "CLUSTER": False,
    "HDIM96": True, "SM8x": True,
}  # HDIM64 / 128 / 192 / 256: compiled in where --hdims names them
DISABLED_DIFF = {"HDIMDIFF64": True, "HDIMDIFF192": True}  # config keys FLASH_ATTENTION_DISABLE_* upstream


#: Features whose kernels FA3 instantiates in files of their own, in its file names' order
#: (flash_fwd_hdim128_bf16_paged_split_softcap_sm90.cu); all but SOFTCAP are forward-only.
OWN_FILES = ("PAGEDKV", "SPLIT", "SOFTCAP", "PACKGQA")
_TAG = {"PAGEDKV": "paged", "SPLIT": "split", "SOFTCAP": "softcap", "PACKGQA": "packgqa"}
#: The feature combinations FA3 0251105 has sm90 files for (PackGQA is built into the split and
#: paged kernels, so it has files of its own only beside softcap or alone).
_FWD_COMBOS = ((), ("PAGEDKV",), ("SPLIT",), ("PAGEDKV", "SPLIT"), ("SOFTCAP",), ("PAGEDKV", "SOFTCAP"),
               ("SPLIT", "SOFTCAP"), ("PAGEDKV", "SPLIT", "SOFTCAP"), ("PACKGQA",), ("SOFTCAP", "PACKGQA"))


def _sources(enable: frozenset[str] = frozenset(), hdims=HDIMS, backward: bool = True) -> list[str]:
    def name(kind, d, combo, dtype="bf16"):
        return f"instantiations/flash_{kind}_hdim{d}_{dtype}{''.join('_' + _TAG[f] for f in combo)}_sm90.cu"

    kernels = []
    for combo in _FWD_COMBOS:
        if set(combo) <= enable:
            kernels += [name("fwd", d, combo) for d in hdims]
            if "FP8" in enable:  # e4m3 forward (FA3 has no FP8 backward)
                kernels += [name("fwd", d, combo, "e4m3") for d in hdims]
            if "HDIMDIFF192" in enable and 192 in hdims:  # q / k 192 with v 128 (DeepSeek's prefill)
                kernels.append(name("fwd", "192_128", combo))
            if "HDIMDIFF64" in enable and 64 in hdims:  # q / k 64 with v 256 / 512 (MLA decode's qv)
                kernels += [name("fwd", f"64_{dv}", combo) for dv in (256, 512)]
            if set(combo) <= {"SOFTCAP"} and backward:
                kernels += [name("bwd", d, combo) for d in hdims]
    combine = ["flash_fwd_combine.cu"] if "SPLIT" in enable else []  # the split kernels' merge
    return ["flash_api_stable.cpp", *kernels, *combine, "flash_prepare_scheduler.cu"]


def pack(fa_repo: Path, cutlass_repo: Path) -> None:
    PEERS.mkdir(exist_ok=True)
    listing = subprocess.run(["git", "-C", str(fa_repo), "ls-tree", "-r", "--name-only", FA3_COMMIT, "hopper/"],
                             check=True, capture_output=True, text=True).stdout.split()
    wanted = {f"hopper/{s}" for s in _sources(frozenset(OWN_FILES))}  # every build's files
    files = [f for f in listing if f in wanted or (not f.startswith("hopper/instantiations/")
                                                  and f.endswith((".h", ".hpp", ".cpp", ".cu", ".py")))]
    missing = wanted - set(files)
    if missing:
        sys.exit(f"not in FA3 {FA3_COMMIT}: {sorted(missing)}")
    subprocess.run(["git", "-C", str(fa_repo), "archive", "--format=tar.gz", "-o", str(FA3_ARCHIVE), FA3_COMMIT, *files],
                   check=True)
    subprocess.run(["git", "-C", str(cutlass_repo), "archive", "--format=tar.gz", "-o", str(CUTLASS_ARCHIVE),
                    CUTLASS_COMMIT, "include"], check=True)
    for a in (FA3_ARCHIVE, CUTLASS_ARCHIVE):
        print(f"{a.relative_to(REPO_ROOT)}: {a.stat().st_size / 1e6:.1f} MB")


def _switches(enable: frozenset[str] = frozenset(), backward: bool = True) -> dict[str, bool]:
    """FA3's DISABLE switches (True = compiled out), with the features in ``enable`` compiled in."""
    unknown = enable - set(DISABLED) - set(DISABLED_DIFF)
    if unknown:
        sys.exit(f"--enable: not an FA3 feature switch: {sorted(unknown)} (known: {sorted(DISABLED | DISABLED_DIFF)})")
    switches = {k: off and k not in enable for k, off in (DISABLED | DISABLED_DIFF).items()}
    switches["BACKWARD"] = not backward
    return switches


def _feature_defines(enable: frozenset[str] = frozenset(), backward: bool = True) -> list[str]:
    return [f"-DFLASHATTENTION_DISABLE_{k}" for k, off in _switches(enable, backward).items() if off]


def build(out: Path, jobs: int, enable: frozenset[str] = frozenset(), hdims=HDIMS, backward: bool = True) -> None:
    for a in (FA3_ARCHIVE, CUTLASS_ARCHIVE):
        if not a.exists():
            sys.exit(f"{a} is missing: run `tools/gpu/fa3_peer.py pack` here and carry .peers/")
    src = out / "src"
    if not src.exists():
        src.mkdir(parents=True)
        for a in (FA3_ARCHIVE, CUTLASS_ARCHIVE):
            with tarfile.open(a) as t:
                t.extractall(src, filter="data")
    hopper, cutlass_include = src / "hopper", src / "include"
    sources = _sources(enable, hdims, backward)
    missing = [f for f in sources if not (hopper / f).exists()]
    if missing:  # instantiation stubs the archive does not carry (hdim 192, the dv != d pairs): FA3's generator writes them
        subprocess.run([sys.executable, "generate_kernels.py", "--output_dir", "instantiations"], cwd=hopper, check=True)

    # The interface module and the build-flag record it reads (FA3's setup.py writes the latter).
    shutil.copy(hopper / "flash_attn_interface.py", out / "flash_attn_interface.py")
    switches = _switches(enable, backward)
    flags = {f"FLASHATTENTION_DISABLE_{k}": switches[k] for k in DISABLED}
    flags |= {f"FLASH_ATTENTION_DISABLE_{k}": switches[k] for k in DISABLED_DIFF}
    flags |= {f"FLASHATTENTION_DISABLE_HDIM{d}": d not in hdims for d in BUILDABLE_HDIMS}
    flags["FLASHATTENTION_ENABLE_VCOLMAJOR"] = False
    (out / "flash_attn_config.py").write_text(f"# written by tools/gpu/fa3_peer.py\nCONFIG = {{'build_flags': {flags!r}}}\n")
    package = out / "flash_attn_3"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")

    os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"  # sm_90a only (wgmma / setmaxnreg)
    os.environ["MAX_JOBS"] = str(jobs)
    from torch.utils.cpp_extension import load

    nvcc = ["-O3", "-std=c++17", "--ftemplate-backtrace-limit=0", "--use_fast_math", "-lineinfo",
            "-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED", "-DCUTLASS_ENABLE_GDC_FOR_SM90",
            "-DCUTLASS_DEBUG_TRACE_LEVEL=0", "-DNDEBUG"]
    cxx = ["-O3", "-std=c++17", "-DPy_LIMITED_API=0x03090000", "-DTORCH_TARGET_VERSION=0x0209000000000000"]
    start = time.time()
    switches_hdim = {f"HDIM{d}": d not in hdims for d in BUILDABLE_HDIMS}
    defines = _feature_defines(enable, backward) + [f"-DFLASHATTENTION_DISABLE_{k}" for k, off in switches_hdim.items() if off]
    load(name="_C", sources=[str(hopper / s) for s in sources], extra_cflags=cxx + defines,
         extra_cuda_cflags=nvcc + defines, extra_include_paths=[str(hopper), str(cutlass_include)],
         build_directory=str(package), is_python_module=False, verbose=False)
    print(f"FA3 {FA3_COMMIT} built in {time.time() - start:.0f} s ({len(sources)} files, {jobs} jobs, "
          f"enabled: {','.join(sorted(enable)) or 'none'}) -> {out}")


def check() -> None:
    """FA3 against our (GPU-tested) kernels on one shape, forward and backward: a broken peer build
    would otherwise show only as odd timings."""
    import torch
    import flash_attn_interface as fa3
    import flash_attn_hopper as ours

    torch.manual_seed(0)
    for causal in (False, True):
        shape = (2, 1000, 16, 128)
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        results = []
        for f in (fa3.flash_attn_func, ours.flash_attn_func):
            o = f(q, k, v, causal=causal)
            o = o[0] if isinstance(o, tuple) else o
            results.append((o, *torch.autograd.grad(o, (q, k, v), dout)))
        errs = [((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(*results)]
        print(f"fa3 against ours, causal={causal}: relative L2 of out / dq / dk / dv",
              " / ".join(f"{e:.1e}" for e in errs))


def export(built: Path, dest: Path) -> None:
    """The files of a built peer that make `flash_attn_interface` importable, without sources or objects."""
    for rel in ("flash_attn_interface.py", "flash_attn_config.py", "flash_attn_3/__init__.py", "flash_attn_3/_C.so"):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(built / rel, dest / rel)
    print(f"{dest}: {sum(f.stat().st_size for f in dest.rglob('*') if f.is_file()) / 1e6:.1f} MB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pk = sub.add_parser("pack", help="write the archives into .peers/ (needs the two git mirrors)")
    pk.add_argument("--fa-repo", type=Path, required=True)
    pk.add_argument("--cutlass-repo", type=Path, required=True)
    bd = sub.add_parser("build", help="unpack and compile (on the GPU machine)")
    bd.add_argument("--out", type=Path, default=Path("/tmp/fa3peer"))
    bd.add_argument("--jobs", type=int, default=int(os.environ.get("MAX_JOBS", "16")))
    bd.add_argument("--enable", default=os.environ.get("FA3_ENABLE", ""),
                    help="comma-separated FA3 switches to compile in, e.g. SOFTCAP,VARLEN (default: $FA3_ENABLE)")
    bd.add_argument("--hdims", default=",".join(map(str, HDIMS)),
                    help="head dims to compile, a subset of 64,128,192,256 (e.g. 128 for a smaller decode peer; "
                         "192 with --enable HDIMDIFF192 for the 192 / 128 pair; 64 with --enable HDIMDIFF64 for "
                         "64 / 256 and 64 / 512, the qv (MLA decode) kernels)")
    bd.add_argument("--no-backward", action="store_true",
                    help="forward kernels only (FLASHATTENTION_DISABLE_BACKWARD), e.g. for the FP8 peer")
    sub.add_parser("check", help="FA3 against flash_attn_hopper on one shape (on the GPU machine)")
    ex = sub.add_parser("export", help="copy a built peer's runtime files (for carrying to the GPU machine)")
    ex.add_argument("built", type=Path)
    ex.add_argument("--to", type=Path, default=PEERS / "fa3built")
    args = p.parse_args()
    if args.cmd == "check":
        check()
    elif args.cmd == "export":
        export(args.built, args.to)
    elif args.cmd == "pack":
        pack(args.fa_repo, args.cutlass_repo)
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        hdims = tuple(int(x) for x in args.hdims.split(","))
        if not set(hdims) <= set(BUILDABLE_HDIMS):
            sys.exit(f"--hdims: a subset of {BUILDABLE_HDIMS}, got {hdims}")
        build(args.out.resolve(), args.jobs, frozenset(x.strip().upper() for x in args.enable.split(",") if x.strip()),
              hdims, backward=not args.no_backward)


if __name__ == "__main__":
    main()
