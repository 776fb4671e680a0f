"""Developer tool for the GPU machine: one forward kernel's TFLOP/s over problem shapes chosen to
separate effects that the benchmark grid confounds (waves of tiles, a partial last key block,
batch), timed in rounds with the shapes' order rotated, each with its tile and wave counts.

    python3 tools/profile/shape_probe.py --hdim 128 --shapes 8192:2:16,8448:2:16,8192:2:33 [--causal] [--rounds 3]

A shape is SEQLEN:BATCH:HEADS (seqlen_q = seqlen_k).
"""
import argparse
import math
import sys
from pathlib import Path

import torch

from flash_attn_hopper import flash_attn_func

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from variants import time_in_rounds  # noqa: E402  (tools/gpu/)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block-m", type=int, default=128, help="for the tile counts printed")
    ap.add_argument("--block-n", type=int, default=176, help="for the key-block counts printed")
    args = ap.parse_args()
    d = args.hdim
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = [tuple(int(x) for x in s.split(":")) for s in args.shapes.split(",")]
    runs = {}
    for s, b, h in shapes:
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        runs[(s, b, h)] = (lambda q=q, k=k, v=v: flash_attn_func(q, k, v, causal=args.causal))
    for (s, b, h), t in time_in_rounds(runs, args.rounds).items():
        flops = 4 * b * h * s * s * d / (2 if args.causal else 1)
        tiles = b * h * math.ceil(s / args.block_m)
        print(f"s={s:6d} b={b:3d} h={h:3d}: {flops / t / 1e9:6.1f} TFLOP/s  tiles {tiles} = {tiles / sms:.2f} waves, "
              f"{s / args.block_n:.2f} key blocks of {args.block_n}", flush=True)


if __name__ == "__main__":
    main()
