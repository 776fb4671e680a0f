#!/usr/bin/env python3
"""Compile kernel instantiations to cubins and digest their SASS, to show that a refactor left the
machine code unchanged.

    python tools/build/sass_digest.py --out /tmp/sass-before          # every (direction, hdim, dtype)
    python tools/build/sass_digest.py --out /tmp/sass-after --hdims 128 --dtypes bf16
    python tools/build/sass_digest.py --compare /tmp/sass-before /tmp/sass-after

Each instantiation file is compiled on its own with setup.py's nvcc flags (no torch headers are
needed: the launchers include none). A kernel's digest is the SHA-256 of its SASS with addresses
and the kernel's own name taken out, so renamed template parameters compare equal while any
changed instruction, register or constant-bank offset does not.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_support as bs  # noqa: E402
import generate_instantiations as gen  # noqa: E402


def find_cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    import importlib.util

    spec = importlib.util.find_spec("triton")
    if spec and spec.origin:
        candidate = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if candidate.is_file():
            return str(candidate)
    raise SystemExit("cuobjdump not found (on PATH or in the triton package)")


def kernel_sass(cubin: Path, cuobjdump: str) -> dict[str, str]:
    """{mangled kernel name: SASS text with addresses and its own name removed}."""
    text = subprocess.run([cuobjdump, "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    kernels: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            kernels[name] = []
            continue
        if name is None:
            continue
        line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)  # instruction addresses
        kernels[name].append(line.replace(name, "<self>").rstrip())
    return {k: "\n".join(v) + "\n" for k, v in kernels.items()}


def build_one(inst, out: Path, cuda_home: str, include_dirs: list[str], cuobjdump: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / inst.filename
        src.write_text(gen.render_instantiation(inst))
        cubin = out / (inst.filename[:-3] + ".cubin")
        extra = os.environ.get("FLASH_ATTN_HOPPER_EXTRA_NVCC_FLAGS", "").split()  # developer macros, as setup.py
        cmd = [str(Path(cuda_home) / "bin" / "nvcc"), *bs.NVCC_FLAGS, *extra, "-Xptxas=-v", "-cubin", "-o", str(cubin),
               str(src), *(f"-I{d}" for d in include_dirs)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        (out / (inst.filename[:-3] + ".ptxas.txt")).write_text(proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"{inst.filename}: nvcc failed\n{proc.stderr[-3000:]}")
    sass = kernel_sass(cubin, cuobjdump)
    digests = {}
    for name, body in sorted(sass.items()):
        digests[name] = hashlib.sha256(body.encode()).hexdigest()
        (out / f"{inst.filename[:-3]}.{digests[name][:12]}.sass").write_text(body)
    return {"file": inst.filename, "kernels": digests}


def build(args) -> int:
    manifest = gen.load_manifest()
    env = dict(os.environ)
    if args.hdims:
        env[manifest.ENV_HDIMS] = args.hdims
    if args.dtypes:
        env[manifest.ENV_DTYPES] = args.dtypes
    selection = manifest.selection_from_env(env)
    cuda_home, how = bs.resolve_cuda_home()
    if cuda_home is None:
        raise SystemExit(f"no CUDA toolkit: {how}")
    include_dirs = [str(REPO_ROOT / "csrc"), *bs.find_cutlass(REPO_ROOT).include_dirs,
                    str(Path(cuda_home) / "include" / "cccl")]
    cuobjdump = find_cuobjdump()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    insts = [i for i in selection.instantiations() if not args.direction or i.direction == args.direction]
    results = []
    with cf.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(build_one, i, out, cuda_home, include_dirs, cuobjdump) for i in insts]
        for fut in cf.as_completed(futures):
            res = fut.result()
            print(f"{res['file']}: {len(res['kernels'])} kernels", flush=True)
            results.append(res)
    (out / "digest.json").write_text(json.dumps(sorted(results, key=lambda r: r["file"]), indent=1))
    return 0


def compare(before: Path, after: Path) -> int:
    a = {r["file"]: r for r in json.loads((Path(before) / "digest.json").read_text())}
    b = {r["file"]: r for r in json.loads((Path(after) / "digest.json").read_text())}
    bad = 0
    for name in sorted(set(a) & set(b)):
        da, db = sorted(a[name]["kernels"].values()), sorted(b[name]["kernels"].values())
        missing = [h for h in da if h not in db]  # kernels of before with no identical kernel after
        new = len(db) - (len(da) - len(missing))
        status = "identical" if not missing else f"{len(missing)} of {len(da)} kernels differ"
        if new and not missing:
            status += f" (+{new} new kernels)"
        bad += bool(missing)
        print(f"{name}: {len(da)} kernels, {status}")
    for name in sorted(set(a) ^ set(b)):
        print(f"{name}: only in {'before' if name in a else 'after'}")
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder for cubins, SASS and digest.json")
    p.add_argument("--hdims")
    p.add_argument("--dtypes")
    p.add_argument("--direction", choices=list(gen.load_manifest().DIRECTIONS))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = p.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        p.error("--out or --compare")
    return build(args)


if __name__ == "__main__":
    sys.exit(main())
