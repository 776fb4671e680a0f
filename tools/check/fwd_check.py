"""Developer check on the GPU: forward correctness on awkward shapes, then a quick timing
against torch's cuDNN SDPA. The real test suite is tests/; the real benchmark is benchmarks/.

    python3 tools/check/fwd_check.py [--hdims 64,128] [--dtypes bf16] [--bench]
"""
import argparse
import math
import sys

import torch


def fwd(*args):
    import flash_attn_hopper._C  # noqa: F401  registers torch.ops.flash_attn_hopper
    return torch.ops.flash_attn_hopper.fwd(*args)


def reference(q, k, v, causal, scale, dtype=torch.float32, window=(-1, -1), top_left=False):
    qf, kf, vf = (t.to(dtype) for t in (q, k, v))
    hq, hk = q.shape[2], k.shape[2]
    if hq != hk:
        kf = kf.repeat_interleave(hq // hk, dim=2)
        vf = vf.repeat_interleave(hq // hk, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", qf, kf).float() * scale
    sq, sk = q.shape[1], k.shape[1]
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq, device=q.device)[:, None] + (0 if top_left else sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    if right >= 0:
        s = s.masked_fill(j > i + right, float("-inf"))
    if left >= 0:
        s = s.masked_fill(j < i - left, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0).to(dtype)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vf)
    return o, lse


def check(b, sq, sk, hq, hk, d, causal, dtype, packed=False, window=(-1, -1), top_left=False):
    torch.manual_seed(sq * 131 + sk * 7 + d + hq)
    dev = "cuda"
    if packed:
        qkv = torch.randn(b, sq, hq + 2 * hk, d, device=dev, dtype=dtype)
        q, k, v = qkv[:, :, :hq], qkv[:, :, hq:hq + hk], qkv[:, :, hq + hk:]
    else:
        q = torch.randn(b, sq, hq, d, device=dev, dtype=dtype)
        k = torch.randn(b, sk, hk, d, device=dev, dtype=dtype)
        v = torch.randn(b, sk, hk, d, device=dev, dtype=dtype)
    scale = 1.0 / math.sqrt(d)
    out, lse = fwd(q, k, v, scale, causal, window[0], window[1], top_left)
    torch.cuda.synchronize()
    o_ref, lse_ref = reference(q, k, v, causal, scale, window=window, top_left=top_left)
    o_low, _ = reference(q, k, v, causal, scale, dtype=dtype, window=window, top_left=top_left)
    err = (out.float() - o_ref).abs().max().item()
    err_low = (o_low.float() - o_ref).abs().max().item()
    finite = torch.isfinite(lse_ref)
    lse_err = (lse - lse_ref)[finite].abs().max().item() if finite.any() else 0.0
    lse_inf_ok = bool(torch.all(lse[~finite] == float("-inf"))) if (~finite).any() else True
    ok = (not torch.isnan(out).any()) and err <= 2 * err_low + 1e-3 and lse_err < 1e-3 and lse_inf_ok
    print(f"{'ok  ' if ok else 'FAIL'} b={b} sq={sq} sk={sk} hq={hq} hk={hk} d={d} causal={int(causal)} "
          f"{str(dtype)[6:]} packed={int(packed)} window={window} top_left={int(top_left)}: max|err|={err:.2e} (torch low-precision {err_low:.2e}) "
          f"lse err={lse_err:.1e}", flush=True)
    return ok


def bench(hdims, dtype):
    from triton.testing import do_bench
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for d in hdims:
        h = 2048 // d
        for causal in (False, True):
            for s in (512, 1024, 2048, 4096, 8192, 16384):
                b = 16384 // s
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3))
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                t_ours = do_bench(lambda: fwd(q, k, v, d ** -0.5, causal), warmup=50, rep=200, return_mode="median")
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    t_cudnn = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                                       warmup=50, rep=200, return_mode="median")
                ours, cudnn = flops / t_ours / 1e9, flops / t_cudnn / 1e9
                print(f"hdim={d} causal={int(causal)} seqlen={s:5d}: ours {ours:6.1f} TFLOP/s  cuDNN {cudnn:6.1f}  "
                      f"ratio {ours / cudnn:.3f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdims", default="128")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--bench", action="store_true")
    args = ap.parse_args()
    hdims = [int(x) for x in args.hdims.split(",")]
    dtypes = [{"bf16": torch.bfloat16, "fp16": torch.float16}[x] for x in args.dtypes.split(",")]
    all_ok = True
    for dtype in dtypes:
        for d in hdims:
            for causal in (False, True):
                for (sq, sk) in [(1, 1), (1, 239), (3, 799), (113, 203), (128, 217), (799, 3), (1024, 1024), (2048, 2049)]:
                    all_ok &= check(2, sq, sk, 6, 2, d, causal, dtype)
                all_ok &= check(1, 4224, 4224, 4, 4, d, causal, dtype)
                all_ok &= check(3, 300, 500, 4, 1, d, causal, dtype, packed=True)
                for (sq, sk) in [(113, 203), (799, 300), (1000, 1000), (257, 3000)]:
                    all_ok &= check(2, sq, sk, 4, 2, d, causal, dtype, top_left=True)
                    for window in [(0, 0), (17, 5), (200, -1), (-1, 300), (64, 0)]:
                        all_ok &= check(2, sq, sk, 4, 2, d, causal, dtype, window=window)
    print("ALL OK" if all_ok else "SOME FAILED", flush=True)
    if args.bench:
        bench(hdims, dtypes[0])
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
