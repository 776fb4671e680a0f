"""Developer tool for the GPU machine: does a provider's speed sag under sustained load, and at
what SM clock and power? Runs one benchmark-method problem back to back for a few seconds per
provider (ours through autograd as benchmarks/benchmark_attn.py times it, cuDNN SDPA, and
FlashAttention-3 when importable), while nvidia-smi samples the SM clock, power and temperature
every 50 ms. Per provider it prints the TFLOP/s of the first 0.2 s and of the last second, with
the mean clock and power over that second, so that two kernels can be compared at equal
clocks (TFLOP/s per GHz) and by energy (GFLOP per joule): this tells power-bound from scheduling
(e.g. when the grid reads a kernel under a single-process timing of it).

    python3 tools/profile/power_probe.py --hdim 128 --seqlen 8192 [--causal] [--fwd] [--seconds 3]
"""
import argparse
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F


def sampler():
    return subprocess.Popen(
        ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits",
         "-lms", "50"], stdout=subprocess.PIPE, text=True)


def parse_samples(text):
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            stamp = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            frac = float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
            rows.append((stamp + frac, float(parts[1]), float(parts[2]), float(parts[3])))
        except ValueError:
            continue
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--fwd", action="store_true", help="the forward instead of the backward")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rest", type=float, default=3.0, help="idle seconds before each provider")
    ap.add_argument("--providers", default="ours,fa3,cudnn,ours")
    args = ap.parse_args()
    d, s = args.hdim, args.seqlen
    b, h = 16384 // s, 2048 // d
    flops = 4 * b * h * s * s * d / (2 if args.causal else 1) * (1 if args.fwd else 2.5)
    q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    fns = {}
    from flash_attn_hopper import flash_attn_func
    qa, ka, va = (x.detach().requires_grad_() for x in (q, k, v))
    try:
        if args.fwd:
            flash_attn_func(qa, ka, va, causal=args.causal)
            fns["ours"] = lambda: flash_attn_func(qa, ka, va, causal=args.causal)  # noqa: E731
        else:
            oa = flash_attn_func(qa, ka, va, causal=args.causal)
            fns["ours"] = lambda: torch.autograd.grad(oa, (qa, ka, va), dout, retain_graph=True)  # noqa: E731
    except RuntimeError as e:  # e.g. a build without this head dim: the peers still run
        print(f"ours: left out ({str(e)[:160]})")
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
    backend = torch.nn.attention.SDPBackend.CUDNN_ATTENTION
    if args.fwd:
        def cudnn():
            with torch.nn.attention.sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
    else:
        with torch.nn.attention.sdpa_kernel(backend):
            ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
        g = dout.transpose(1, 2)

        def cudnn():
            return torch.autograd.grad(ref, (qt, kt, vt), g, retain_graph=True)
    fns["cudnn"] = cudnn
    try:
        from flash_attn_interface import flash_attn_func as fa3_func
        q3, k3, v3 = (x.detach().requires_grad_() for x in (q, k, v))
        if args.fwd:
            fns["fa3"] = lambda: fa3_func(q3, k3, v3, causal=args.causal)  # noqa: E731
        else:
            o3 = fa3_func(q3, k3, v3, causal=args.causal)
            o3 = o3[0] if isinstance(o3, tuple) else o3
            fns["fa3"] = lambda: torch.autograd.grad(o3, (q3, k3, v3), dout, retain_graph=True)  # noqa: E731
    except ImportError:
        print("fa3: not importable, left out")
    print(f"hdim {d} seqlen {s} batch {b} heads {h} causal={args.causal} {'fwd' if args.fwd else 'bwd'}")
    for name in args.providers.split(","):
        if name not in fns:
            continue
        fn = fns[name]
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        time.sleep(args.rest)
        proc = sampler()
        time.sleep(0.3)
        events = []
        t_start = time.time()
        # Launch in chunks so that the CPU never runs far ahead of the GPU (the host timestamps
        # of each chunk's end line the samples up with the iterations).
        while time.time() - t_start < args.seconds:
            chunk = []
            for _ in range(4):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                fn()
                e1.record()
                chunk.append((e0, e1))
            chunk[-1][1].synchronize()
            now = time.time()
            events.extend((now, e0.elapsed_time(e1)) for e0, e1 in chunk)
        t_end = time.time()
        time.sleep(0.2)
        proc.terminate()
        samples = parse_samples(proc.communicate()[0])
        first = [ms for t, ms in events if t - t_start <= 0.2] or [events[0][1]]
        last = [ms for t, ms in events if t >= t_end - 1.0]
        window = [x for x in samples if t_end - 1.0 <= x[0] <= t_end]
        if not window:
            window = samples[-10:]
        clk = statistics.mean(x[1] for x in window) if window else float("nan")
        pwr = statistics.mean(x[2] for x in window) if window else float("nan")
        tmp = max(x[3] for x in window) if window else float("nan")
        tf_first = flops / statistics.median(first) / 1e9
        tf_last = flops / statistics.median(last) / 1e9
        print(f"  {name:6s} first 0.2 s {tf_first:6.1f} TFLOP/s, last 1 s {tf_last:6.1f} TFLOP/s ({len(events)} iters)"
              f" | SM {clk:6.0f} MHz, {pwr:5.0f} W, {tmp:3.0f} C | {tf_last / clk * 1e3:6.1f} TFLOP/s per GHz,"
              f" {tf_last / pwr * 1e3:6.1f} GFLOP/J")


if __name__ == "__main__":
    main()
