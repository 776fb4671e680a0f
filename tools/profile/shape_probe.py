"""Developer tool for the GPU machine: one forward kernel's TFLOP/s over problem shapes chosen to
separate effects that the benchmark grid confounds (waves of tiles, a partial last key block,
batch, a tile's fixed cost against its cost per key block), timed in rounds with the shapes' and
providers' order rotated, each with its tile and wave counts.

    python3 tools/profile/shape_probe.py --hdim 128 --shapes 8192:2:16,8448:2:16,8192:2:33 [--causal] [--rounds 3]
    python3 tools/profile/shape_probe.py --fp8 --providers ours,fa3 --block-n 224 --fit \\
        --hdim 128 --shapes 4096:4480:4:16,4096:8960:4:16,4096:13440:4:16

A shape is SEQLEN:BATCH:HEADS (seqlen_q = seqlen_k) or SEQLEN_Q:SEQLEN_K:BATCH:HEADS. --fit: per
provider, the least-squares line through the shapes' times per wave against key blocks per tile
(shapes of one tile count): its intercept is the tile's fixed cost, its slope one key block's.
"""
import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from variants import time_in_rounds  # noqa: E402  (tools/gpu/)


def provider_fn(name):
    if name == "fa3":
        from flash_attn_interface import flash_attn_func as f  # the peer (tools/gpu/fa3_peer.py)
    else:
        from flash_attn_hopper import flash_attn_func as f
    return f


def fit(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--fp8", action="store_true", help="float8_e4m3fn q, k, v (FP8 forward)")
    ap.add_argument("--providers", default="ours", help="comma list of ours, fa3")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block-m", type=int, default=128, help="for the tile counts printed")
    ap.add_argument("--block-n", type=int, default=176, help="for the key-block counts printed and fitted")
    ap.add_argument("--fit", action="store_true", help="fixed and per-block cost per tile, per provider")
    args = ap.parse_args()
    d = args.hdim
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = []
    for s in args.shapes.split(","):
        f = [int(x) for x in s.split(":")]
        shapes.append((f[0], f[0], f[1], f[2]) if len(f) == 3 else tuple(f))
    providers = args.providers.split(",")
    runs = {}
    for sq, sk, b, h in shapes:
        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        if args.fp8:
            q, k, v = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
        for p in providers:
            fn = provider_fn(p)
            runs[(p, sq, sk, b, h)] = (lambda fn=fn, q=q, k=k, v=v: fn(q, k, v, causal=args.causal))
    med = time_in_rounds(runs, args.rounds)
    points = {p: [] for p in providers}
    for (p, sq, sk, b, h), t in med.items():
        flops = 4 * b * h * sq * sk * d / (2 if args.causal else 1)
        tiles = b * h * math.ceil(sq / args.block_m)
        waves = tiles / sms
        blocks = math.ceil(sk / args.block_n)
        points[p].append((blocks, t * 1e3 / math.ceil(waves)))
        print(f"{p:5s} sq={sq:6d} sk={sk:6d} b={b:3d} h={h:3d}: {flops / t / 1e9:6.1f} TFLOP/s  {t * 1e3:8.1f} us  "
              f"tiles {tiles} = {waves:.2f} waves, {sk / args.block_n:.2f} key blocks of {args.block_n}", flush=True)
    if args.fit:
        for p, pts in points.items():
            a, s = fit([x for x, _ in pts], [y for _, y in pts])
            print(f"fit {p}: per tile {a:.2f} us fixed + {s:.3f} us per key block of {args.block_n} "
                  f"(fixed = {a / s:.2f} blocks)")


if __name__ == "__main__":
    main()
