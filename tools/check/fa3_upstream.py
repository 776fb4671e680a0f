#!/usr/bin/env python3
"""FlashAttention-3's own test files, with flash_attn_hopper's functions standing in for FA3's.

Unpacks the test files named by --tests (and the helpers they import, test_util.py and padding.py)
from the FA3 archive that tools/gpu/fa3_peer.py packs (.peers/fa3-hopper-<commit>.tar.gz) into a
scratch folder. Beside them it writes a `flash_attn_interface.py` that re-exports ours, and a
`flash_attn.layers.rotary` whose `apply_rotary_emb` is rotary_ref.py's plain-torch rotation (FA3's
kvcache tests drop their rotary cases without one). Then it runs pytest there against the package
as installed or on PYTHONPATH, and prints, per test function, the passed / failed / skipped counts
and the failures grouped by their first error line.

FP8 cases are switched off (FLASH_ATTENTION_DISABLE_FP8=TRUE) unless --fp8 (the FP8 forward runs
dense, varlen and KV-cache calls, contiguous and paged).
Every other feature the test files parametrize runs.

    python3 tools/check/fa3_upstream.py --tests test_flash_attn.py -k "test_flash_attn_output" --workers 16

FA3's race-condition test allocates a 70 GiB dummy tensor: run it alone (`-k race_condition
--workers 0`); with many workers the combine and KV-cache cases can run out of memory too.
Results: docs/fa3-upstream-tests.md.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
HELPERS = ("test_util.py", "padding.py")
# Cases about FA3's own build rather than its functions: deselected, and said so.
NOT_OURS = {
    "test_flash_attn.py::test_flash3_bw_compatibility": "checks the schemas of torch.ops.flash_attn_3, FA3's op namespace",
}
# What FA3's test files import from flash_attn_interface.
SHIM = '''"""FA3's interface module, answered by flash_attn_hopper (tools/check/fa3_upstream.py)."""
from flash_attn_hopper import (  # noqa: F401
    flash_attn_combine,
    flash_attn_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
    get_scheduler_metadata,
)
'''


def default_archive() -> Path | None:
    found = sorted((REPO_ROOT / ".peers").glob("fa3-hopper-*.tar.gz"))
    return found[-1] if found else None


def unpack(archive: Path, tests: list[str], scratch: Path) -> None:
    """The named test files and their helpers from the archive's hopper/, the shims beside them."""
    scratch.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        for name in [*tests, *HELPERS]:
            member = tar.getmember(f"hopper/{name}")
            source = tar.extractfile(member)
            if source is None:
                raise SystemExit(f"{archive}: hopper/{name} is not a file")
            (scratch / name).write_bytes(source.read())
    (scratch / "flash_attn_interface.py").write_text(SHIM)
    layers = scratch / "flash_attn" / "layers"
    layers.mkdir(parents=True, exist_ok=True)
    for package in (scratch / "flash_attn", layers):
        (package / "__init__.py").write_text("")
    shutil.copy(Path(__file__).with_name("rotary_ref.py"), layers / "rotary.py")


def sample_ids(ids: list[str], per_function: int, seed: int) -> list[str]:
    """At most per_function of each test function's cases, drawn with the seed (kept in file order)."""
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for node in ids:
        groups[node.split("[", 1)[0]].append(node)
    rng = random.Random(seed)
    keep = set()
    for nodes in groups.values():
        keep.update(nodes if len(nodes) <= per_function else rng.sample(nodes, per_function))
    return [node for node in ids if node in keep]


def summarize(junit: Path) -> tuple[str, int]:
    """Counts per test function and the failures grouped by their first error line; the number of
    failed or errored cases."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "?")
        function = name.split("[", 1)[0]
        params = name[len(function):].strip("[]")
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            counts[function]["failed"] += 1
            first = (problem.get("message") or problem.text or "").strip().splitlines()
            failures[(function, first[0][:160] if first else "?")].append(params)
        elif case.find("skipped") is not None:
            counts[function]["skipped"] += 1
        else:
            counts[function]["passed"] += 1
    lines = ["| test | passed | failed | skipped |", "|---|---|---|---|"]
    for function in sorted(counts):
        c = counts[function]
        lines.append(f"| {function} | {c['passed']} | {c['failed']} | {c['skipped']} |")
    if failures:
        lines += ["", "Failures by first error line (count, a few parameter sets):"]
        for (function, message), params in sorted(failures.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"- {function}, {len(params)}x: {message}")
            lines += [f"    [{p}]" for p in params[:3]]
    return "\n".join(lines), sum(c["failed"] for c in counts.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archive", type=Path, default=default_archive(), help="FA3's hopper/ archive")
    parser.add_argument("--tests", default="test_flash_attn.py", help="comma list of hopper/ test files")
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k expression")
    parser.add_argument("--workers", type=int, default=0, help="pytest-xdist workers (0: none)")
    parser.add_argument("--timeout", type=int, default=0, help="stop pytest after this many seconds (0: never)")
    parser.add_argument("--fp8", action="store_true", help="run FA3's FP8 cases too")
    parser.add_argument("--sample", type=int, default=0,
                        help="at most this many cases per test function, drawn with --seed (0: all; the files hold ~109k)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/fa3-upstream"))
    parser.add_argument("--out", type=Path, default=None, help="folder for junit.xml and summary.md")
    args = parser.parse_args(argv)
    if args.archive is None or not args.archive.is_file():
        parser.error("no FA3 archive: pack one with `tools/gpu/fa3_peer.py pack` or pass --archive")
    tests = [t.strip() for t in args.tests.split(",") if t.strip()]
    if args.scratch.exists():
        shutil.rmtree(args.scratch)
    unpack(args.archive, tests, args.scratch)
    out = args.out or args.scratch
    out.mkdir(parents=True, exist_ok=True)
    junit = out / "junit.xml"
    command = [sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider", "-rN", f"--junitxml={junit}"]
    if args.keyword:
        command += ["-k", args.keyword]
    for node, why in NOT_OURS.items():
        if node.split("::")[0] in tests:
            command += ["--deselect", node]
            print(f"fa3_upstream: deselected {node}: {why}", flush=True)
    if args.workers:
        command += ["-n", str(args.workers)]
    env = dict(os.environ)
    if not args.fp8:
        env["FLASH_ATTENTION_DISABLE_FP8"] = "TRUE"
    if args.sample:  # the sampled node ids, handed to pytest in an argument file
        listing = subprocess.run([*command[:3], *tests, "--collect-only", "-q", "-p", "no:cacheprovider",
                                  *(["-k", args.keyword] if args.keyword else [])],
                                 cwd=args.scratch, env=env, capture_output=True, text=True)
        ids = [line for line in listing.stdout.splitlines() if "::" in line and line not in NOT_OURS]
        if not ids:
            print(listing.stdout[-2000:] + listing.stderr[-2000:])
            return 1
        chosen = sample_ids(ids, args.sample, args.seed)
        (args.scratch / "cases.txt").write_text("\n".join(chosen) + "\n")
        command = [*command[:3], "@cases.txt", *command[3 + len(tests):]]
        print(f"fa3_upstream: {len(chosen)} of {len(ids)} collected cases (seed {args.seed})", flush=True)
    print(f"fa3_upstream: {args.archive.name}: {' '.join(command[3:])} (in {args.scratch})", flush=True)
    proc = subprocess.Popen(command, cwd=args.scratch, env=env)
    try:
        code = proc.wait(timeout=args.timeout or None)
    except subprocess.TimeoutExpired:  # as Ctrl-C: pytest still writes the report of what ran
        proc.send_signal(signal.SIGINT)
        print(f"fa3_upstream: interrupted after {args.timeout} s", flush=True)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        code = 124
    if not junit.is_file():
        print("fa3_upstream: pytest wrote no report", flush=True)
        return code or 1
    table, failed = summarize(junit)
    (out / "summary.md").write_text(table + "\n")
    print(table, flush=True)
    return 1 if failed else code


if __name__ == "__main__":
    sys.exit(main())
