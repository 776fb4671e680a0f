"""Developer tool for the GPU machine: where the time of one benchmark-method problem goes, kernel
by kernel (torch.profiler), for our ops, cuDNN SDPA and FlashAttention-3 (when importable, e.g.
built by tools/gpu/fa3_peer.py) side by side. Average microseconds
per call of every kernel that ran, the memsets and copies included.

    python3 tools/profile/kernel_breakdown.py --hdim 128 --seqlens 512,8192 [--causal] [--bwd]
    python3 tools/profile/kernel_breakdown.py --decode 1x4096x32:8,8x32768x32:8 [--splits 0,1]
    python3 tools/profile/kernel_breakdown.py --varlen "16k + 64 x U[16,512]" [--causal] [--bwd]

--decode BATCHxCACHExHQ:HKV times flash_attn_with_kvcache (one query token) per num_splits: the
kernels, the host's launch time per call, the do_bench median, a CUDA-graph replay (no host) and
the kernels that replay runs.
"""
import time
import argparse
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile


def kernel_times(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    totals = defaultdict(float)
    first, last = float("inf"), 0.0
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            totals[evt.name] += evt.device_time / iters  # microseconds
            first, last = min(first, evt.time_range.start), max(last, evt.time_range.end)
    # The device's span per call, from the first kernel's start to the last one's end: the kernels
    # plus the gaps between them (launches, a memset's turnaround), which the totals leave out.
    span = (last - first) / iters if last > first else 0.0
    return totals, span


def show(label, times):
    totals, span = times
    total = sum(totals.values())
    print(f"  {label}: {total:9.1f} us in all, {span:9.1f} us device span per call (gaps included)")
    for name, t in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"    {t:9.1f} us {100 * t / total:5.1f} %  {name[:110]}")


def host_costs(fn, iters):
    """Where the host's time per call goes: the synchronizing ops (torch's sync debug mode) and the
    Python functions with the most cumulative time (cProfile)."""
    import cProfile
    import pstats
    import warnings
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    torch.cuda.set_sync_debug_mode(0)
    for w in caught:
        print(f"    sync: {str(w.message)[:160]} ({w.filename}:{w.lineno})")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        fn()
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


def decode(cases, splits, hdim, iters, host_profile=False):
    from triton.testing import do_bench

    from flash_attn_hopper import flash_attn_with_kvcache
    for case in cases.split(","):
        b, cache, heads = case.split("x")
        b, cache = int(b), int(cache)
        hq, hk = (int(x) for x in heads.split(":"))
        q = torch.randn(b, 1, hq, hdim, device="cuda", dtype=torch.bfloat16)
        kc, vc = (torch.randn(b, cache, hk, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        lens = torch.full((b,), cache, device="cuda", dtype=torch.int32)
        gb = 2 * kc.numel() * kc.element_size() / 1e9
        print(f"decode batch {b} cache {cache} heads {hq}:{hk} hdim {hdim} ({gb:.3f} GB of K+V)")
        for n in (int(x) for x in splits.split(",")):
            fn = lambda: flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=n)  # noqa: E731
            show(f"num_splits={n}", kernel_times(fn, iters))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            host = (time.perf_counter() - t0) / iters * 1e6
            torch.cuda.synchronize()
            ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
            print(f"    host {host:8.1f} us/call; do_bench {ms * 1e3:8.1f} us ({gb / ms * 1e3:6.0f} GB/s)")
            if host_profile:
                host_costs(fn, iters)
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fn()
                graph_ms = do_bench(g.replay, warmup=25, rep=200, return_mode="median")
                print(f"    graph replay {graph_ms * 1e3:8.1f} us ({gb / graph_ms * 1e3:6.0f} GB/s)")
                show("graph replay's kernels", kernel_times(g.replay, iters))  # what the capture recorded
            except RuntimeError as e:
                print(f"    graph capture failed: {str(e)[:200]}")


def varlen(names, hdim, causal, bwd, iters):
    """benchmarks/benchmark_varlen.py's ragged cases (by name, separated by ';'): ours and FA3's varlen."""
    import sys
    from pathlib import Path

    from triton.testing import do_bench
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import benchmark_varlen as bv

    from flash_attn_hopper import flash_attn_varlen_func as ours_fn
    try:
        from flash_attn_interface import flash_attn_varlen_func as fa3_fn
    except ImportError:
        fa3_fn = None
    by_name = {c.name: c for c in bv.cases("all")}
    for name in names.split(";"):
        lengths = by_name[name].lengths
        h = bv.HEADS_X_HDIM // hdim
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
        total, max_len = int(cu[-1]), max(lengths)
        q, k, v, dout = (torch.randn(total, h, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        print(f"varlen {name}: {len(lengths)} sequences, {total} tokens, hdim {hdim} heads {h} causal={causal}")
        for label, fn in (("ours", ours_fn), ("fa3", fa3_fn)):
            if fn is None:
                continue
            qa, ka, va = (x.detach().requires_grad_() for x in (q, k, v))
            call = lambda: fn(qa, ka, va, cu, cu, max_len, max_len, causal=causal)  # noqa: E731
            if bwd:
                o = call()
                o = o[0] if isinstance(o, tuple) else o
                run = lambda: torch.autograd.grad(o, (qa, ka, va), dout, retain_graph=True)  # noqa: E731
            else:
                run = call
            show(label, kernel_times(run, iters))
            print(f"  {label}: {do_bench(run, warmup=25, rep=200, return_mode='median') * 1e3:9.1f} us (do_bench median)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--decode", default="", help="BATCHxCACHExHQ:HKV,... (flash_attn_with_kvcache)")
    ap.add_argument("--splits", default="0,1", help="--decode: the num_splits values to time")
    ap.add_argument("--host-profile", action="store_true", help="--decode: the host's syncs and Python costs")
    ap.add_argument("--varlen", default="", help="benchmarks/benchmark_varlen.py case names, separated by ';'")
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlens", default="512,8192")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--bwd", action="store_true", help="the backward only (forward outputs computed once)")
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    if args.decode:
        return decode(args.decode, args.splits, args.hdim, args.iters, args.host_profile)
    if args.varlen:
        return varlen(args.varlen, args.hdim, args.causal, args.bwd, args.iters)
    import flash_attn_hopper._C  # noqa: F401
    from triton.testing import do_bench
    op = torch.ops.flash_attn_hopper
    d = args.hdim
    for s in (int(x) for x in args.seqlens.split(",")):
        b, h = 16384 // s, 2048 // d
        q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        scale = d ** -0.5
        print(f"hdim {d} seqlen {s} batch {b} heads {h} causal={args.causal} {'bwd' if args.bwd else 'fwd'}")
        out, lse = op.fwd(q, k, v, scale, args.causal)
        if args.bwd:
            ours = lambda: op.bwd(dout, q, k, v, out, lse, scale, args.causal, -1, -1, False, False)  # noqa: E731
        else:
            ours = lambda: op.fwd(q, k, v, scale, args.causal)  # noqa: E731
        show("ours", kernel_times(ours, args.iters))
        if args.bwd:
            # The same backward through autograd, as benchmarks/benchmark_attn.py times it, and the
            # do_bench median of both ways (the grid read 4 % less than the bwd op alone once).
            from flash_attn_hopper import flash_attn_func
            qa, ka, va = (x.detach().requires_grad_() for x in (q, k, v))
            oa = flash_attn_func(qa, ka, va, causal=args.causal)  # out alone (return_attn_probs=False)
            ours_ag = lambda: torch.autograd.grad(oa, (qa, ka, va), dout, retain_graph=True)  # noqa: E731
            show("ours (autograd)", kernel_times(ours_ag, args.iters))
            for label, fn in (("bwd op", ours), ("autograd", ours_ag)):
                ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
                print(f"  ours {label}: {ms * 1e3:9.1f} us (do_bench median)")
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
            if args.bwd:
                g = dout.transpose(1, 2)
                peer = lambda: torch.autograd.grad(ref, (qt, kt, vt), g, retain_graph=True)  # noqa: E731
            else:
                peer = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)  # noqa: E731
            show("cudnn", kernel_times(peer, args.iters))
            if not args.bwd:  # what the benchmark sees: the calls back to back, host included
                for label, fn in (("ours", ours), ("cudnn", peer)):
                    ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
                    print(f"  {label} fwd: {ms * 1e3:9.1f} us (do_bench median)")
        try:
            from flash_attn_interface import flash_attn_func as fa3_func
        except ImportError:
            continue
        q3, k3, v3 = (x.detach().requires_grad_() for x in (q, k, v))
        o3 = fa3_func(q3, k3, v3, causal=args.causal)
        o3 = o3[0] if isinstance(o3, tuple) else o3
        if args.bwd:
            fa3 = lambda: torch.autograd.grad(o3, (q3, k3, v3), dout, retain_graph=True)  # noqa: E731
        else:
            fa3 = lambda: fa3_func(q3, k3, v3, causal=args.causal)  # noqa: E731
        show("fa3", kernel_times(fa3, args.iters))


if __name__ == "__main__":
    main()
