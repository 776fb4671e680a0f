"""Developer check on the GPU of the paged-KV op, through torch.ops directly (no Python-side
validation): well-formed calls (page sizes 1 / 16 / 256, splits 1 and 4) against the per-sequence
float32 reference over the gathered cache, then malformed page tables, cu_seqlens_k and seqused_k
that no host check can see without a sync (page numbers negative or past the cache, lengths past the
table's capacity, negative offsets), where only memory safety is asked: run it under
compute-sanitizer memcheck (see sanitize_check.py for the environment).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 9 \\
        python3 tools/check/paged_check.py [--hdims 64,128,256] [--dtype bf16]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import varlen_check  # noqa: E402  (reference)


def check(page_size, splits, lengths_q, lengths_k, hq, hk, d, causal, dtype):
    dev = "cuda"
    batch = len(lengths_q)
    per_seq = -(-max(lengths_k) // page_size)
    num_pages = batch * per_seq + 3
    k_pages = torch.randn(num_pages, page_size, hk, d, device=dev, dtype=dtype)
    v_pages = torch.randn(num_pages, page_size, hk, d, device=dev, dtype=dtype)
    table = torch.randperm(num_pages, device=dev)[: batch * per_seq].view(batch, per_seq).to(torch.int32)
    q = torch.randn(sum(lengths_q), hq, d, device=dev, dtype=dtype)
    t = lambda xs: torch.tensor(xs, dtype=torch.int32, device=dev)  # noqa: E731
    cu_q = t([0] + torch.tensor(lengths_q).cumsum(0).tolist())
    used = t(lengths_k)
    scale = d ** -0.5
    out, lse = varlen_check.ops().paged_fwd(q, k_pages, v_pages, table, cu_q, t([0] * (batch + 1)), used,
                                            max(lengths_q), max(lengths_k), scale, causal, num_splits=splits)
    pos = torch.arange(per_seq * page_size, device=dev)
    k = k_pages[table.long()[:, pos // page_size], pos % page_size]  # (batch, capacity, hk, d)
    v = v_pages[table.long()[:, pos // page_size], pos % page_size]
    cap = k.shape[1]
    cu_k = t([b * cap for b in range(batch + 1)])
    ref, ref_lse = varlen_check.reference(q, k.reshape(-1, hk, d), v.reshape(-1, hk, d), cu_q, cu_k, None, used,
                                          causal, scale)
    err = (out.float() - ref).abs().max().item()
    ok = err < 2e-2 and torch.allclose(lse, ref_lse, atol=2e-3, equal_nan=True)
    print(f"{'ok  ' if ok else 'FAIL'} page {page_size} splits {splits} q {lengths_q} k {lengths_k} d={d} "
          f"causal={causal} max err {err:.2e}", flush=True)
    return ok


def malformed(hq, hk, d, dtype):
    """Contents no host check sees: the call must finish without touching memory outside the
    tensors (memcheck) and without an error; the results are not checked."""
    dev = "cuda"
    t = lambda xs: torch.tensor(xs, dtype=torch.int32, device=dev)  # noqa: E731
    k_pages = torch.randn(6, 16, hk, d, device=dev, dtype=dtype)
    v_pages = torch.randn(6, 16, hk, d, device=dev, dtype=dtype)
    q = torch.randn(3, hq, d, device=dev, dtype=dtype)
    cu_q = t([0, 1, 2, 3])
    cases = [
        ("pages out of range", t([[-5, 1], [6, 99999], [2**30, -2**30]]), t([0, 0, 0, 0]), t([32, 32, 32])),
        ("lengths past capacity", t([[0, 1], [2, 3], [4, 5]]), t([0, 0, 0, 0]), t([10**6, -7, 33])),
        ("offsets past capacity", t([[0, 1], [2, 3], [4, 5]]), t([-100, 31, 10**6, 5]), t([5, 40, 3])),
    ]
    for name, table, cu_k, used in cases:
        for causal in (False, True):
            for splits in (1, 3):
                varlen_check.ops().paged_fwd(q, k_pages, v_pages, table, cu_q, cu_k, used, 1, 10**6, 0.1, causal,
                                             num_splits=splits)
            torch.cuda.synchronize()
        print(f"ran  malformed ({name}) d={d}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--dtype", default="bf16")
    args = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    ok = True
    for d in [int(x) for x in args.hdims.split(",")]:
        for page_size in (1, 16, 256):
            for splits in (1, 4):
                ok &= check(page_size, splits, [1, 1, 1], [700, 1, 333], 8, 2, d, True, dtype)
                ok &= check(page_size, splits, [5, 0, 130], [300, 7, 1000], 4, 4, d, page_size != 16, dtype)
        malformed(4, 2, d, dtype)
    print("all ok" if ok else "SOME CASES FAILED", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
