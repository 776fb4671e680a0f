"""Developer check on the GPU, meant to run under compute-sanitizer: one small forward and
backward call for every kernel class of a build (policy.h: short / long keys, persistent with
an own O buffer or O stored from registers, dynamic causal, deterministic, GQA), on odd sizes, each
checked against the float32 reference as in tools/check/fwd_check.py / tools/check/bwd_check.py.

Run it with PYTORCH_NO_CUDA_MEMORY_CACHING=1, so that every tensor is its own allocation and
memcheck sees an access past a tensor's end (the caching allocator would hide it inside a
larger segment):

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 9 \\
        python3 tools/check/sanitize_check.py [--hdims 64,128,256] [--dtype bf16] [--quick]

Exits 1 if a result is wrong; compute-sanitizer's own exit code (9 above) reports its errors.
`--fp8` runs the FP8 forward's paths instead (dense, varlen with empty and one-row sequences,
window + sink + softcap + attention_chunk, a contiguous KV cache with appends, a paged cache whose
table points outside it, split-KV decode steps with PackGQA; outputs must be finite).
`--probe` instead launches one Triton kernel whose name contains "flash" and which stores one
element past its tensor's end: under memcheck with the same filter it must be reported (exit 9),
which shows that the filter instruments kernels by that name and that memcheck sees a
one-element overrun of an uncached allocation.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwd_check  # noqa: E402
import fwd_check  # noqa: E402

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, causal): per head dim, what reaches each tile
# class. Below 1k keys the short-keys kernels, from 4096 the long-keys ones; 4400 keys pad less
# with 176-key blocks than with 128 (hdim 128's direct-O tile); 3 and 1 queries leave most rows
# of a tile past seqlen_q; 799 x 3 has fewer keys than queries (bottom-right causal: rows with
# nothing to attend).
CASES = {
    64: [(2, 113, 203, 2, 1, False), (1, 300, 4100, 2, 2, False), (2, 113, 203, 2, 1, True),
         (1, 300, 4100, 2, 2, True), (1, 799, 3, 2, 2, True)],
    128: [(2, 113, 203, 2, 1, False), (1, 300, 4400, 2, 2, False), (1, 300, 4096, 2, 2, False),
          (2, 113, 203, 2, 1, True), (1, 3, 4400, 2, 1, True), (1, 799, 3, 2, 2, True)],
    256: [(2, 113, 203, 2, 1, False), (1, 300, 2100, 2, 2, False), (1, 300, 4100, 2, 2, False),
          (2, 113, 203, 2, 1, True), (1, 1, 4100, 2, 2, True), (1, 799, 3, 2, 2, True)],
}


def probe():
    import triton
    import triton.language as tl

    @triton.jit
    def flash_probe_out_of_bounds(x_ptr, n):
        tl.store(x_ptr + n, 1.0)  # one element past the end

    x = torch.zeros(1000, device="cuda", dtype=torch.float32)
    flash_probe_out_of_bounds[(1,)](x, x.numel())
    torch.cuda.synchronize()
    print("probe launched", flush=True)


def fp8_cases(hdims) -> bool:
    import flash_attn_hopper as fa

    f8 = torch.float8_e4m3fn
    gen = torch.Generator(device="cuda").manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, device="cuda", generator=gen).to(f8)

    outs = []
    for d in hdims:
        q, k, v = r(2, 77, 4, d), r(2, 131, 2, d), r(2, 131, 2, d)
        ds = torch.rand(2, 2, device="cuda", generator=gen) + 0.5
        for causal in (False, True):
            outs.append(fa.flash_attn_func(q, k, v, causal=causal, q_descale=ds, k_descale=ds, v_descale=ds))
        outs.append(fa.flash_attn_func(q, k, v, window_size=(20, 5), softcap=10.0, attention_chunk=33,
                                       learnable_sink=torch.randn(4, device="cuda", generator=gen)))
        lq, lk = [0, 1, 70, 3], [4, 0, 90, 1]
        cq, ck = (torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
                  for x in (lq, lk))
        outs.append(fa.flash_attn_varlen_func(r(sum(lq), 4, d), r(sum(lk), 2, d), r(sum(lk), 2, d), cq, ck, max(lq),
                                              max(lk), causal=True))
        outs.append(fa.flash_attn_with_kvcache(
            r(2, 3, 4, d), r(2, 140, 2, d), r(2, 140, 2, d), k=r(2, 3, 2, d), v=r(2, 3, 2, d),
            cache_seqlens=torch.tensor([0, 120], dtype=torch.int32, device="cuda"), causal=True))
        # A paged cache (page 16) whose table holds pages past the cache and negative ones, lengths
        # past the table's capacity: clamped in the kernel.
        pages = r(6, 16, 2, d)
        table = torch.tensor([[0, 5, 9, -3], [2, 1, 4, 3]], dtype=torch.int32, device="cuda")
        outs.append(fa.flash_attn_varlen_func(
            r(4, 4, d), pages, pages, torch.tensor([0, 1, 4], dtype=torch.int32, device="cuda"), None, 3, 64,
            seqused_k=torch.tensor([70, 33], dtype=torch.int32, device="cuda"), page_table=table, causal=True,
            k_descale=ds))
        # Decode over the paged cache and a contiguous one: split-KV with PackGQA.
        lens = torch.tensor([64, 17], dtype=torch.int32, device="cuda")
        outs.append(fa.flash_attn_with_kvcache(r(2, 1, 4, d), pages, pages, cache_seqlens=lens, page_table=table[:, :4],
                                               num_splits=3, q_descale=ds))
        outs.append(fa.flash_attn_with_kvcache(r(2, 1, 4, d), r(2, 140, 2, d), r(2, 140, 2, d), cache_seqlens=lens,
                                               num_splits=5, v_descale=ds))
    torch.cuda.synchronize()
    ok = all(bool(o.float().isfinite().all()) for o in outs)
    print(f"fp8: {len(outs)} calls, outputs {'finite' if ok else 'NOT FINITE'}", flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--quick", action="store_true", help="the first case of each head dim, causal and not")
    ap.add_argument("--no-bwd", action="store_true")
    ap.add_argument("--probe", action="store_true", help="only the planted overrun (see above)")
    ap.add_argument("--fp8", action="store_true", help="the FP8 forward's paths instead (see above)")
    args = ap.parse_args()
    if args.probe:
        probe()
        return
    if args.fp8:
        ok = fp8_cases([int(x) for x in args.hdims.split(",")])
        print("all ok" if ok else "SOME CASES FAILED", flush=True)
        sys.exit(0 if ok else 1)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1":
        print("warning: PYTORCH_NO_CUDA_MEMORY_CACHING is not 1; memcheck cannot see overruns inside "
              "the caching allocator's segments", flush=True)
    ok = True
    for d in [int(x) for x in args.hdims.split(",")]:
        cases = CASES[d]
        if args.quick:
            cases = [c for c in cases if c[:5] == cases[0][:5]]
        for b, sq, sk, hq, hk, causal in cases:
            ok &= fwd_check.check(b, sq, sk, hq, hk, d, causal, dtype)
            if not args.no_bwd:
                ok &= bwd_check.check(b, sq, sk, hq, hk, d, causal, dtype)
                if (b, sq, sk) == (2, 113, 203):
                    ok &= bwd_check.check(b, sq, sk, hq, hk, d, causal, dtype, deterministic=True)
    print("all ok" if ok else "SOME CASES FAILED", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
