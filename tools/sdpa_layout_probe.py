"""Does the layout we hand to torch's SDPA change cuDNN's speed?

benchmarks/benchmark_attn.py gives SDPA (batch, heads, seqlen, dim) views of (batch, seqlen,
heads, dim) tensors (q.transpose(1, 2)), the layout flash_attn_func takes. This probe times
cuDNN (and torch's FA2) on those views and on contiguous (batch, heads, seqlen, dim) tensors,
same shapes, same method (do_bench median, rotated order, several rounds). Needs only torch and
triton, not our extension.
    python3 tools/sdpa_layout_probe.py [--hdims 64,128,256] [--seqlens 512,2048,8192] [--rounds 3]
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hdims", default="64,128,256")
    p.add_argument("--seqlens", default="512,2048,8192")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backends", default="CUDNN_ATTENTION,FLASH_ATTENTION")
    a = p.parse_args()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} cuDNN {torch.backends.cudnn.version()}")
    print("backend,hdim,causal,seqlen,layout,tflops")
    for hdim in map(int, a.hdims.split(",")):
        for causal in (False, True):
            for seqlen in map(int, a.seqlens.split(",")):
                batch, heads = 16384 // seqlen, 2048 // hdim
                flops = 4 * batch * heads * seqlen * seqlen * hdim / (2 if causal else 1)
                g = torch.Generator(device="cuda").manual_seed(0)
                bshd = [torch.randn(batch, seqlen, heads, hdim, device="cuda", dtype=torch.bfloat16, generator=g)
                        for _ in range(3)]
                layouts = {"bshd-view": [t.transpose(1, 2) for t in bshd],
                           "bhsd-contig": [t.transpose(1, 2).contiguous() for t in bshd]}
                for backend in a.backends.split(","):
                    res = {k: [] for k in layouts}
                    names = list(layouts)
                    for r in range(a.rounds):
                        for name in names[r % 2:] + names[:r % 2]:
                            q, k, v = layouts[name]
                            def fn():
                                with sdpa_kernel(getattr(SDPBackend, backend)):
                                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            res[name].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
                    for name in names:
                        ms = statistics.median(res[name])
                        print(f"{backend},{hdim},{causal},{seqlen},{name},{flops / ms / 1e9:.1f}", flush=True)


if __name__ == "__main__":
    main()
