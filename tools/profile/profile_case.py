"""Developer tool for the GPU machine: run one benchmark-method problem a few times through the
raw ops, so that a profiler (ncu) can capture a representative launch of the forward or the
backward kernel. Prints the median time of the last runs.

    ncu --clock-control none -k regex:flash_bwd_kernel -s 2 -c 1 --section SpeedOfLight \\
        python3 tools/profile/profile_case.py --hdim 128 --seqlen 8192 --bwd
    --provider fa3 runs FlashAttention-3 instead (flash_attn_interface, e.g. built by
    tools/gpu/fa3_peer.py; its backward kernel matches regex:FlashAttnBwdSm90); --provider cudnn runs
    torch SDPA forced to cuDNN (layout (batch, heads, seqlen, hdim) views of the same tensors).
    --varlen runs ours through flash_attn_varlen_func on the same tensors packed (equal lengths), so
    that the dense and the varlen kernels of one shape can be profiled side by side. --softcap X runs
    ours (and fa3) with that softcap. --fp8 runs the FP8 forward (ours and fa3: float8_e4m3fn q, k, v).
"""
import argparse
import statistics

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--bwd", action="store_true", help="also run the backward op")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--provider", choices=["ours", "fa3", "cudnn"], default="ours")
    ap.add_argument("--varlen", action="store_true", help="ours through flash_attn_varlen_func, equal lengths")
    ap.add_argument("--softcap", type=float, default=0.0)
    ap.add_argument("--fp8", action="store_true", help="the FP8 forward (ours, fa3) on float8_e4m3fn inputs")
    args = ap.parse_args()
    d, s = args.hdim, args.seqlen
    b, h = 16384 // s, 2048 // d
    q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = d ** -0.5
    if args.fp8:  # forward only, as FA3's FP8
        q, k, v = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
        if args.provider == "fa3":
            from flash_attn_interface import flash_attn_func as fa3_func

            def run():
                fa3_func(q, k, v, causal=args.causal, softcap=args.softcap)
        else:
            import flash_attn_hopper._C  # noqa: F401

            def run():
                torch.ops.flash_attn_hopper.fwd_fp8(q, k, v, None, None, None, scale, args.causal,
                                                    softcap=args.softcap)
    elif args.provider == "fa3":
        from flash_attn_interface import flash_attn_func as fa3_func

        q, k, v = (x.requires_grad_() for x in (q, k, v))

        def run():
            out = fa3_func(q, k, v, causal=args.causal, deterministic=args.deterministic, softcap=args.softcap)
            out = out[0] if isinstance(out, tuple) else out
            if args.bwd:
                torch.autograd.grad(out, (q, k, v), dout)
    elif args.provider == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        qt, kt, vt, dot = (x.transpose(1, 2) for x in (q, k, v, dout))
        if args.bwd:
            qt, kt, vt = (x.requires_grad_() for x in (qt, kt, vt))

        def run():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = sdpa(qt, kt, vt, is_causal=args.causal)
                if args.bwd:
                    torch.autograd.grad(out, (qt, kt, vt), dot)
    elif args.varlen:
        import flash_attn_hopper

        qp, kp, vp = (x.reshape(b * s, h, d).requires_grad_(args.bwd) for x in (q, k, v))
        cu = torch.arange(0, (b + 1) * s, s, device="cuda", dtype=torch.int32)

        def run():
            out = flash_attn_hopper.flash_attn_varlen_func(qp, kp, vp, cu, cu, s, s, causal=args.causal,
                                                           deterministic=args.deterministic, softcap=args.softcap)
            out = out[0] if isinstance(out, tuple) else out
            if args.bwd:
                torch.autograd.grad(out, (qp, kp, vp), dout.reshape(b * s, h, d))
    else:
        import flash_attn_hopper._C  # noqa: F401
        op = torch.ops.flash_attn_hopper

        def run():
            out, lse = op.fwd(q, k, v, scale, args.causal, -1, -1, False, args.softcap)
            if args.bwd:
                op.bwd(dout, q, k, v, out, lse, scale, args.causal, -1, -1, False, args.deterministic, args.softcap)
    times = []
    for _ in range(args.runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    print(f"{args.provider}{' varlen' if args.varlen else ''} hdim {d} seqlen {s} causal={args.causal} bwd={args.bwd}: median {statistics.median(times):.3f} ms "
          f"over {args.runs} runs (fwd{' + bwd' if args.bwd else ''})")


if __name__ == "__main__":
    main()
