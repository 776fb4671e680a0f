"""Developer check on the GPU of the varlen ops, through torch.ops directly (no Python-side
validation): well-formed batches against a per-sequence float32 reference (forward, and the
backward against autograd of the reference), then malformed cu_seqlens / seqused that no host
check can see without a sync (non-monotone, negative, past the end, seqused past its segment),
where only memory safety is asked: run it under compute-sanitizer memcheck (see
sanitize_check.py for the environment) and the kernels must touch nothing outside the tensors.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 9 \\
        python3 tools/check/varlen_check.py [--hdims 64,128,256] [--dtype bf16] [--no-bwd]
"""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fwd_check  # noqa: E402  (reference)


def ops():
    import flash_attn_hopper._C  # noqa: F401  registers torch.ops.flash_attn_hopper
    return torch.ops.flash_attn_hopper


def reference(q, k, v, cu_q, cu_k, used_q, used_k, causal, scale, dtype=torch.float32):
    """Per-sequence (out, lse) of packed q, k, v; rows outside the used parts: 0 / -inf."""
    out = torch.zeros(q.shape, device=q.device, dtype=dtype)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device)
    for b in range(len(cu_q) - 1):
        sq = cu_q[b + 1] - cu_q[b] if used_q is None else used_q[b]
        sk = cu_k[b + 1] - cu_k[b] if used_k is None else used_k[b]
        if sq == 0:
            continue
        qs, ks, vs = (t[c:c + n][None] for t, c, n in ((q, cu_q[b], sq), (k, cu_k[b], sk), (v, cu_k[b], sk)))
        if sk == 0:
            continue
        o, l = fwd_check.reference(qs, ks, vs, causal, scale, dtype=dtype)
        out[cu_q[b]:cu_q[b] + sq] = o[0].to(dtype)
        lse[:, cu_q[b]:cu_q[b] + sq] = l[0]
    return out, lse


def check(lengths_q, lengths_k, hq, hk, d, causal, dtype, used=False, bwd=True):
    torch.manual_seed(sum(lengths_q) * 31 + d + hq)
    dev = "cuda"
    cu_q = [0]
    cu_k = [0]
    for a, b in zip(lengths_q, lengths_k):
        cu_q.append(cu_q[-1] + a)
        cu_k.append(cu_k[-1] + b)
    used_q = [max(0, n - 3) for n in lengths_q] if used else None
    used_k = [max(0, n - 5) for n in lengths_k] if used else None
    q = torch.randn(cu_q[-1], hq, d, device=dev, dtype=dtype)
    k = torch.randn(cu_k[-1], hk, d, device=dev, dtype=dtype)
    v = torch.randn(cu_k[-1], hk, d, device=dev, dtype=dtype)
    t = lambda xs: None if xs is None else torch.tensor(xs, dtype=torch.int32, device=dev)  # noqa: E731
    scale = 1.0 / math.sqrt(d)
    args = (t(cu_q), t(cu_k), t(used_q), t(used_k), max(lengths_q), max(lengths_k), scale, causal)
    out, lse = ops().varlen_fwd(q, k, v, *args)
    torch.cuda.synchronize()
    o_ref, lse_ref = reference(q, k, v, cu_q, cu_k, used_q, used_k, causal, scale)
    o_low, _ = reference(q, k, v, cu_q, cu_k, used_q, used_k, causal, scale, dtype=dtype)
    rows = torch.zeros(q.shape[0], dtype=torch.bool, device=dev)  # rows some sequence uses
    for b in range(len(lengths_q)):
        rows[cu_q[b]:cu_q[b] + (lengths_q[b] if used_q is None else used_q[b])] = True
    if used_q is not None:
        rows[:] = True  # with seqused the binding defines every row (0 / -inf outside)
    err = (out.float() - o_ref)[rows].abs().max().item() if rows.any() else 0.0
    err_low = (o_low.float() - o_ref)[rows].abs().max().item() if rows.any() else 0.0
    finite = torch.isfinite(lse_ref) & rows[None]
    lse_err = (lse - lse_ref)[finite].abs().max().item() if finite.any() else 0.0
    ok = not torch.isnan(out[rows]).any() and err <= 2 * err_low + 1e-3 and lse_err < 1e-3
    if bwd:
        dout = torch.randn_like(q)
        dq, dk, dv, _ = ops().varlen_bwd(dout, q, k, v, out, lse, *args)
        leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
        o_f, _ = reference(*leaves, cu_q, cu_k, used_q, used_k, causal, scale)
        g_ref = torch.autograd.grad(o_f, leaves, dout.float())
        leaves_low = [x.detach().requires_grad_() for x in (q, k, v)]
        o_l, _ = reference(*leaves_low, cu_q, cu_k, used_q, used_k, causal, scale, dtype=dtype)
        g_low = torch.autograd.grad(o_l, leaves_low, dout)
        for name, g, r, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), g_ref, g_low):
            e, e_low = (g.float() - r).abs().max().item(), (lo.float() - r).abs().max().item()
            good = not torch.isnan(g).any() and e <= 2 * e_low + 1e-3
            ok &= good
            if not good:
                print(f"     {name}: max|err|={e:.2e} (torch low-precision {e_low:.2e})", flush=True)
    print(f"{'ok  ' if ok else 'FAIL'} varlen q={lengths_q} k={lengths_k} hq={hq} hk={hk} d={d} causal={int(causal)} "
          f"used={int(used)} {str(dtype)[6:]}: max|err|={err:.2e} (torch {err_low:.2e}) lse err={lse_err:.1e}",
          flush=True)
    return ok


def malformed(hq, hk, d, dtype, bwd=True):
    """Contents no host check sees: the call must finish without touching memory outside the
    tensors (memcheck) and without an error; the results are not checked."""
    dev = "cuda"
    q = torch.randn(300, hq, d, device=dev, dtype=dtype)
    k = torch.randn(200, hk, d, device=dev, dtype=dtype)
    v = torch.randn(200, hk, d, device=dev, dtype=dtype)
    t = lambda xs: torch.tensor(xs, dtype=torch.int32, device=dev)  # noqa: E731
    cases = [
        ("non-monotone", t([0, 250, 100, 300]), t([0, 150, 50, 200]), None, None),
        ("past the end", t([0, 100, 900, 5000]), t([0, 100, 400, 9000]), None, None),
        ("negative", t([-70, 20, -5, 300]), t([-1000, 10, 150, 200]), None, None),
        ("seqused past segment", t([0, 100, 200, 300]), t([0, 50, 100, 200]), t([500, -3, 100]), t([900, 60, -1])),
        ("last offset short", t([0, 10, 20, 30]), t([0, 5, 10, 15]), None, None),
    ]
    for name, cu_q, cu_k, used_q, used_k in cases:
        for causal in (False, True):
            out, lse = ops().varlen_fwd(q, k, v, cu_q, cu_k, used_q, used_k, 300, 200, 0.1, causal)
            if bwd:
                ops().varlen_bwd(torch.randn_like(q), q, k, v, out, lse, cu_q, cu_k, used_q, used_k, 300, 200, 0.1,
                                 causal)
            torch.cuda.synchronize()
        print(f"ran  malformed ({name}) d={d}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--no-bwd", action="store_true")
    args = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    bwd = not args.no_bwd
    ok = True
    for d in [int(x) for x in args.hdims.split(",")]:
        for causal in (False, True):
            ok &= check([113, 0, 1, 300], [203, 5, 0, 64], 4, 2, d, causal, dtype, bwd=bwd)
            ok &= check([128, 128, 128], [128, 128, 128], 2, 2, d, causal, dtype, bwd=bwd)
            ok &= check([700, 3, 41], [699, 4500, 40], 2, 1, d, causal, dtype, used=True, bwd=bwd)
        malformed(4, 2, d, dtype, bwd=bwd)
    print("all ok" if ok else "SOME CASES FAILED", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
