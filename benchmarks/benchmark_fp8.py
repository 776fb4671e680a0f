#!/usr/bin/env python3
"""FP8 (e4m3) forward: TFLOP/s of flash_attn_func on float8_e4m3fn q, k, v with (batch, nheads_kv)
descales, against FlashAttention-3's FP8 forward (a peer built by tools/gpu/fa3_peer.py with
--enable FP8) and our bf16 forward on the same shapes, median of rotated rounds.

Grid (issue 43's): head dims 64 / 128 / 256, causal and not, seqlen 512 to 16k with batch x seqlen
= 16k tokens and nheads x headdim = 2048.

    python benchmarks/benchmark_fp8.py --rounds 3      # results/fp8-<date>.{csv,md,png}
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchmark_attn as ba  # noqa: E402  (timing, environment, providers)
import rounds  # noqa: E402  (rotated rounds, results files)

TOKENS, WIDTH = 16384, 2048
FP8 = torch.float8_e4m3fn


def _call(fn, fp8: bool):
    def run(q, k, v, descale, causal):
        if not fp8:
            return fn(q, k, v, causal=causal)
        return fn(q, k, v, causal=causal, q_descale=descale, k_descale=descale, v_descale=descale)

    return run


def _ours(fp8=True):
    import flash_attn_hopper

    reason = flash_attn_hopper.unavailable_reason()
    if reason is not None:
        raise ba.ProviderUnavailable(reason)
    return _call(flash_attn_hopper.flash_attn_func, fp8)


PROVIDERS = {"flash_attn_hopper": _ours, "fa3": lambda: _call(ba.fa3_function("flash_attn_func"), True),
             "flash_attn_hopper-bf16": lambda: _ours(False)}


@dataclass
class Row:
    provider: str
    hdim: int
    causal: bool
    seqlen: int
    fwd_tflops: float = math.nan
    sm_mhz: float = math.nan  # median SM clock and board power while the timing ran (gpu_state.Sampler)
    power_w: float = math.nan


def measure(provider, run, hdim, causal, seqlen, args) -> Row:
    row = Row(provider, hdim, causal, seqlen)
    batch, heads = max(1, TOKENS // seqlen), WIDTH // hdim
    dtype = torch.bfloat16 if provider.endswith("bf16") else FP8
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, seqlen, heads, hdim, device="cuda", generator=gen).to(dtype) for _ in range(3))
    descale = torch.rand(batch, heads, device="cuda", generator=gen) + 0.5
    sampler = ba.Sampler()
    try:
        with torch.no_grad(), sampler:
            ms = ba.time_ms(lambda: run(q, k, v, descale, causal), args.warmup, args.rep)
        flops = 4 * batch * heads * seqlen * seqlen * hdim / (2 if causal else 1)
        row.fwd_tflops = flops / ms / 1e9
    except Exception as err:  # a failing provider records NaN and the run goes on
        print(f"    {provider} hdim {hdim} causal={causal} seqlen {seqlen} failed: {ba._first_line(err)}", flush=True)
    row.sm_mhz, row.power_w = sampler.median()
    del q, k, v
    torch.cuda.empty_cache()
    return row


def markdown(rows: list[Row], env: dict) -> str:
    providers = list(dict.fromkeys(r.provider for r in rows))
    table = {(r.provider, r.hdim, r.causal, r.seqlen): r.fwd_tflops for r in rows}
    keys = list(dict.fromkeys((r.hdim, r.causal, r.seqlen) for r in rows))
    ratio = "fa3" in providers and "flash_attn_hopper" in providers
    out = [f"# FP8 forward, {env['date']}", "",
           f"GPU {env['gpu']}, torch {env['torch']}, flash_attn_hopper {env['flash_attn_hopper']}. TFLOP/s of the "
           f"forward; float8_e4m3fn q, k, v with (batch, nheads_kv) descales (bf16 for -bf16), {TOKENS} tokens, "
           f"nheads x hdim = {WIDTH}; median of the rounds, providers rotated.", "",
           "| hdim | causal | seqlen | " + " | ".join(providers) + (" | ours / fa3 |" if ratio else " |"),
           "|" + "---|" * (len(providers) + 3 + ratio)]
    for key in keys:
        cells = [f"{table.get((p, *key), math.nan):.0f}" for p in providers]
        if ratio:
            cells.append(f"{table.get(('flash_attn_hopper', *key), math.nan) / table.get(('fa3', *key), math.nan):.3f}")
        out.append("| " + " | ".join(map(str, key)) + " | " + " | ".join(cells) + " |")
    clocks = [f"{p} {ba._fmt(ba._median_finite([r.sm_mhz for r in rows if r.provider == p]))} MHz / "
              f"{ba._fmt(ba._median_finite([r.power_w for r in rows if r.provider == p]))} W" for p in providers]
    out += ["", "SM clock / board power while timed (median over the points): " + ", ".join(clocks) + "."]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hdims", type=ints, default=[64, 128, 256])
    p.add_argument("--seqlens", type=ints, default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--causal", default="false,true")
    p.add_argument("--providers", default="flash_attn_hopper,fa3")
    ba.common_args(p)
    p.add_argument("--out", type=Path, default=None, help="file stem (default results/fp8-<date>)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 1
    runs = ba.load_providers(PROVIDERS, args.providers.split(","))
    causals = [c.strip().lower() == "true" for c in args.causal.split(",")]
    points = [(h, c, s) for h in args.hdims for c in causals for s in args.seqlens]
    rows = []
    for i, (hdim, causal, seqlen) in enumerate(points):
        medians = rounds.rotated_medians(runs, i, args.rounds,
                                         lambda n, run: measure(n, run, hdim, causal, seqlen, args),
                                         ("fwd_tflops", "sm_mhz", "power_w"))
        for n, m in medians.items():
            rows.append(Row(n, hdim, causal, seqlen, m["fwd_tflops"], m["sm_mhz"], m["power_w"]))
            print(f"hdim {hdim:3d} causal={causal!s:5} seqlen {seqlen:5d} {n:24s} {rows[-1].fwd_tflops:7.0f} TFLOP/s",
                  flush=True)
    rounds.write_results("fp8", ["provider", "hdim", "causal", "seqlen", "fwd_tflops", "sm_mhz", "power_w"],
                         [[r.provider, r.hdim, r.causal, r.seqlen, f"{r.fwd_tflops:.1f}", f"{r.sm_mhz:.0f}",
                           f"{r.power_w:.0f}"] for r in rows],
                         markdown(rows, ba.environment()), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
