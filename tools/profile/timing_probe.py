"""One forward point timed several ways in one process, providers interleaved, to find out which
timing conditions move a provider's number (issue 45: benchmark_attn.py read FA3's causal forward
~10 % below another harness while reading ours about the same), and where time goes outside the
kernel (the host path, the clock under the power cap).

    python tools/profile/timing_probe.py --hdim 128 --seqlen 8192 --causal [--providers flash_attn_hopper,fa3]

Methods (each a median over --rounds rounds, providers rotated within a round):
  do_bench    triton.testing.do_bench as benchmark_attn.py uses it (zeroes a 256 MB buffer before
              every call to flush L2, one event pair per call)
  flush       the same done here: 256 MB zero_() then one event pair per call
  events      one event pair per call, calls back to back (no flush)
  loop        one event pair around --calls back-to-back calls
  graph       --calls calls captured in a CUDA graph, replayed between one event pair
  cold        --idle seconds of an idle GPU, then one event pair around 10 back-to-back calls (what a
              harness that times short bursts between pauses reads: the clock before the power cap bites)
  host        the host time to issue one call (--calls calls, no synchronization), as a TFLOP/s
              figure: where it is below the others, the Python/C++ path limits the pace
Providers are benchmark_attn.py's (flash_attn_hopper, fa3, sdpa-cudnn, ...). At the end: the
clock-limiting reasons nvidia-smi reports active while the first provider runs back to back.
Each line also gives the SM clock and board power read right after the method's timing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import benchmark_attn as ba  # noqa: E402

_FLUSH = None


def _flush() -> None:
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    _FLUSH.zero_()


def per_call(fn, calls: int, flush: bool) -> float:
    times = []
    for _ in range(calls):
        if flush:
            _flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in times)


def loop(fn, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def cold(fn, idle: float) -> float:
    torch.cuda.synchronize()
    time.sleep(idle)
    return loop(fn, 10)


def host(fn, calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e3


def clock_reasons(fn) -> list[str]:
    for _ in range(300):
        fn()
    perf = subprocess.run(["nvidia-smi", "-q", "-d", "PERFORMANCE"], capture_output=True, text=True).stdout
    torch.cuda.synchronize()
    return [line.split(":")[0].strip() for line in perf.splitlines() if line.strip().endswith(": Active")]


def graph(fn, calls: int) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hdim", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=8192)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--providers", default="flash_attn_hopper,fa3")
    p.add_argument("--methods", default="do_bench,flush,events,loop,graph,cold")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--idle", type=float, default=1.0, help="seconds idle before each cold burst")
    args = p.parse_args(argv)
    runs = ba.load_providers(ba.PROVIDERS, args.providers.split(","))
    batch, nheads = ba.TOKENS // args.seqlen, ba.HEADS_X_HDIM // args.hdim
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, args.seqlen, nheads, args.hdim, device="cuda", dtype=torch.bfloat16,
                           generator=gen) for _ in range(3))
    flops = ba.fwd_flops(batch, nheads, args.seqlen, args.hdim, args.causal)
    methods = {
        "do_bench": lambda fn: ba.time_ms(fn, 25, 100),
        "flush": lambda fn: per_call(fn, args.calls, True),
        "events": lambda fn: per_call(fn, args.calls, False),
        "loop": lambda fn: loop(fn, args.calls),
        "graph": lambda fn: graph(fn, args.calls),
        "cold": lambda fn: cold(fn, args.idle),
        "host": lambda fn: host(fn, args.calls),
    }
    chosen = args.methods.split(",")
    results = {(m, n): [] for m in chosen for n in runs}
    state = {(m, n): [] for m in chosen for n in runs}
    with torch.no_grad():
        for name, run in runs.items():
            for _ in range(5):
                run(q, k, v, args.causal)
        torch.cuda.synchronize()
        for r in range(args.rounds):
            for m in chosen:
                for name in ba.round_orders(list(runs), r, 1)[0]:
                    fn = lambda run=runs[name]: run(q, k, v, args.causal)  # noqa: E731
                    results[(m, name)].append(flops / methods[m](fn) / 1e9)
                    state[(m, name)].append(ba.gpu_state())
    print(f"hdim {args.hdim} seqlen {args.seqlen} causal {args.causal} batch {batch} nheads {nheads}; "
          f"TFLOP/s median (min-max) over {args.rounds} rounds, SM MHz, W")
    for m in chosen:
        for name in runs:
            t = results[(m, name)]
            mhz = statistics.median(s[0] for s in state[(m, name)])
            watts = statistics.median(s[1] for s in state[(m, name)])
            print(f"  {m:9} {name:18} {statistics.median(t):7.1f} ({min(t):6.1f}-{max(t):6.1f})  "
                  f"{mhz:6.0f} MHz {watts:5.0f} W")
    first = next(iter(runs))
    with torch.no_grad():
        reasons = clock_reasons(lambda: runs[first](q, k, v, args.causal))
    print(f"clock event reasons active while {first} runs back to back: {reasons}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
