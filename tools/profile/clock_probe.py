"""Developer tool for the GPU machine: where a benchmark point's time goes outside the kernel.
For one benchmark-method problem it times each provider three ways and samples the GPU's SM
clock and power (nvidia-smi, every 50 ms) while it runs:
  bench   triton.testing.do_bench's median (an L2 flush before each call, as benchmark_attn.py)
  b2b     50 calls back to back between two CUDA events (no flush): the kernels' own pace
  host    the host time to issue one call (50 calls, no synchronization): the Python/C++ path
Where `bench` is far above `b2b`, the flush's cold L2 or a host path slower than the flush
kernel adds to the timed region; where the clock under load is low, power limits the pace.

    python3 tools/profile/clock_probe.py --hdim 128 --seqlen 8192 [--causal] [--rounds 2] [--batch B] [--profile]
"""
import argparse
import statistics
import subprocess
import time

import torch


def sampler():
    return subprocess.Popen(
        ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
         "--format=csv,noheader,nounits", "-lms", "50"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def stop(proc):
    proc.terminate()
    out, _ = proc.communicate()
    rows = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            rows.append((float(parts[0]), float(parts[1]), float(parts[2])))
        except (ValueError, IndexError):
            continue
    if not rows:
        return "no samples: " + out[:200]
    busy = [r for r in rows if r[1] > 200] or rows  # samples while the GPU draws real power
    clk = statistics.median(r[0] for r in busy)
    pw = statistics.median(r[1] for r in busy)
    return f"{len(busy)}/{len(rows)} busy samples: SM {clk:.0f} MHz, {pw:.0f} W, {max(r[2] for r in rows):.0f} C"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=None, help="default: 16384 tokens // seqlen")
    ap.add_argument("--profile", action="store_true", help="cProfile 2000 host calls of flash_attn_func")
    args = ap.parse_args()
    from triton.testing import do_bench
    import flash_attn_hopper
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    d, s = args.hdim, args.seqlen
    b, h = args.batch or max(1, 16384 // s), 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    flops = 4 * b * h * s * s * d / (2 if args.causal else 1)

    def ours():
        return flash_attn_hopper.flash_attn_func(q, k, v, causal=args.causal)

    scale = d ** -0.5

    def ours_op():  # the registered op straight, without flash_attn_func's checks
        return torch.ops.flash_attn_hopper.fwd(q, k, v, scale, args.causal)[0]

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)

    torch.set_grad_enabled(False)  # as benchmark_attn.py's forward timing
    for r in range(args.rounds):
        providers = [("ours", ours), ("ours-op", ours_op), ("cudnn", cudnn)]
        providers = providers[r % 3:] + providers[:r % 3]
        for name, fn in providers:
            fn()
            torch.cuda.synchronize()
            p = sampler()
            time.sleep(0.2)
            ms = do_bench(fn, warmup=25, rep=300, return_mode="median")
            bench_clk = stop(p)
            p = sampler()
            time.sleep(0.2)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(10):
                fn()
            start.record()
            for _ in range(50):
                fn()
            end.record()
            end.synchronize()
            b2b = start.elapsed_time(end) / 50
            b2b_clk = stop(p)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(50):
                fn()
            host_us = (time.perf_counter() - t0) / 50 * 1e6
            torch.cuda.synchronize()
            print(f"round {r} {name:5s}: bench {ms:.3f} ms ({flops / ms / 1e9:.0f} TFLOP/s) | b2b {b2b:.3f} ms "
                  f"({flops / b2b / 1e9:.0f}) | host {host_us:.0f} us/call")
            print(f"    bench clocks: {bench_clk}")
            print(f"    b2b   clocks: {b2b_clk}")
    if args.profile:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            ours()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    # The clock-limiting reasons while our kernels run back to back.
    for _ in range(300):
        ours()
    perf = subprocess.run(["nvidia-smi", "-q", "-d", "PERFORMANCE"], capture_output=True, text=True).stdout
    torch.cuda.synchronize()
    print("clock event reasons active:", [line.split(":")[0].strip() for line in perf.splitlines() if line.strip().endswith(": Active")])


if __name__ == "__main__":
    main()
