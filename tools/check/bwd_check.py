"""Developer check on the GPU: backward gradients on awkward shapes against autograd through a
float32 reference, by FlashAttention's rule (error <= 2x the same maths in the input dtype, plus
noise). Needs a build with the backward (see the README's build knobs). The real tests are
tests/test_flash_bwd.py.

    python3 tools/check/bwd_check.py [--hdims 64,128] [--dtypes bf16]
"""
import argparse
import math
import sys

import torch

from fwd_check import reference


def poison_bwd_allocations(b, sq, sk, hq, hk, d, dtype):
    """Fill the blocks the binding's next allocations will get (dq, dk, dv, then the workspaces:
    LSE2, D, the float32 dQ accumulator; then int32 garbage where the deterministic mode's
    semaphores go) with NaN / garbage, so that rows a kernel forgets to write, or an accumulator
    it assumes zeroed, show (as tests/helpers/inputs.py, poison_allocations)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    sq_pad = (sq + 127) // 128 * 128
    d_pad = next(x for x in (64, 96, 128, 192, 256) if x >= d)
    blocks = [torch.full(shape, float("nan"), dtype=dt, device="cuda") for shape, dt in (
        ((b, sq, hq, d), dtype), ((b, sk, hk, d), dtype), ((b, sk, hk, d), dtype),
        ((b, hq, sq_pad), torch.float32), ((b, hq, sq_pad), torch.float32), ((b, hq, sq_pad, d_pad), torch.float32))]
    blocks.append(torch.full((b, hq, sq_pad // 64, 2), -7, dtype=torch.int32, device="cuda"))
    del blocks


def check(b, sq, sk, hq, hk, d, causal, dtype, window=(-1, -1), top_left=False, op=None, deterministic=False):
    """op: an op namespace with fwd and bwd (default torch.ops.flash_attn_hopper)."""
    if op is None:
        import flash_attn_hopper._C  # noqa: F401
        op = torch.ops.flash_attn_hopper
    torch.manual_seed(sq * 7 + sk * 13 + d + hq)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    dout = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
    scale = 1.0 / math.sqrt(d)
    out, lse = op.fwd(q, k, v, scale, causal, window[0], window[1], top_left)
    poison_bwd_allocations(b, sq, sk, hq, hk, d, dtype)
    dq, dk, dv, _ = op.bwd(dout, q, k, v, out, lse, scale, causal, window[0], window[1], top_left, deterministic)
    torch.cuda.synchronize()
    grads = {}
    for name, dt in (("ref", torch.float32), ("low", dtype)):
        qq, kk, vv = (t.detach().to(dt).requires_grad_() for t in (q, k, v))
        o, _ = reference(qq, kk, vv, causal, scale, dtype=dt, window=window, top_left=top_left)
        grads[name] = torch.autograd.grad(o, (qq, kk, vv), dout.to(dt))
    ok = True
    errs = []
    for i, (name, got) in enumerate((("dq", dq), ("dk", dk), ("dv", dv))):
        ref, low = grads["ref"][i].float(), grads["low"][i].float()
        err = (got.float() - ref).abs().max().item()
        bound = 2 * (low - ref).abs().max().item() + 1e-3 * max(1.0, ref.abs().max().item())
        ok &= bool(torch.isfinite(got).all()) and err <= bound
        errs.append(f"{name} {err:.1e}/{bound:.1e}")
    print(f"{'ok  ' if ok else 'FAIL'} b={b} sq={sq} sk={sk} hq={hq} hk={hk} d={d} causal={int(causal)} "
          f"window={window} top_left={int(top_left)} det={int(deterministic)} {str(dtype)[6:]}: " + ", ".join(errs),
          flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdims", default="128")
    ap.add_argument("--dtypes", default="bf16")
    args = ap.parse_args()
    all_ok = True
    for dtype in [{"bf16": torch.bfloat16, "fp16": torch.float16}[x] for x in args.dtypes.split(",")]:
        for d in [int(x) for x in args.hdims.split(",")]:
            for causal in (False, True):
                for (sq, sk) in [(1, 1), (1, 239), (3, 799), (113, 203), (128, 217), (799, 3), (1024, 1024)]:
                    all_ok &= check(2, sq, sk, 6, 2, d, causal, dtype)
                all_ok &= check(1, 2048, 2049, 4, 4, d, causal, dtype)
            all_ok &= check(2, 300, 500, 4, 2, d, False, dtype, window=(37, 11))
            all_ok &= check(2, 500, 300, 4, 2, d, True, dtype, top_left=True)
    print("ALL OK" if all_ok else "SOME FAILED", flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
