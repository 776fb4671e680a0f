#!/usr/bin/env python3
"""Run one compiler command and log its wall time and peak memory: setup.py's nvcc wrapper.

    measure_compile.py LOG -- nvcc ARGS...

setup.py sets torch's ``PYTORCH_NVCC`` to this script, so ninja runs every nvcc job through it.
After the job it appends one line ``output<TAB>seconds<TAB>peak_rss_kib<TAB>exit_code`` to LOG
(a single short append, atomic on POSIX). The peak is that of the largest process of the job
(cicc, ptxas, the host compiler), from the kernel's rusage of the finished children: nvcc runs its
phases one after another, so this is the job's peak resident memory. Exits with the compiler's
exit code and passes its output through untouched.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time


def output_of(args: list[str]) -> str:
    for i, arg in enumerate(args):
        if arg == "-o" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("-o") and len(arg) > 2 and not arg.startswith("-o="):
            return arg[2:]
    return "?"


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: measure_compile.py LOG -- COMMAND ARGS...", file=sys.stderr)
        return 2
    log, command = argv[0], argv[2:]
    start = time.monotonic()
    code = subprocess.call(command)
    seconds = time.monotonic() - start
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    try:
        with open(log, "a") as f:
            f.write(f"{output_of(command)}\t{seconds:.1f}\t{peak_kib}\t{code}\n")
    except OSError:
        pass  # the measurement is a report, never a reason to fail the build
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
