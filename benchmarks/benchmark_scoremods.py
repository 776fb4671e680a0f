#!/usr/bin/env python3
"""What score modifiers cost (issue 42's bar): ours with softcap and with a learnable sink against
ours without, and ours with softcap against FlashAttention-3 with softcap, measured in the same run.

Points (bf16, nheads x hdim = 2048, 16k tokens): seqlen 512 / 2k / 8k / 16k at hdim 64 / 128 / 256,
causal and not. Providers: plain (ours), softcap (ours, softcap=30), sink (ours, learnable_sink),
padded (ours on v zero-padded to q's head dim, with --dv; not by default), fa3 and fa3-softcap (FA3 built with softcap). FLOPs as benchmark_attn.py (forward 4·B·H·S²·D,
halved when causal; backward 2.5x); with --dv (v's head dim, FA3's dv != d, e.g. --hdims 192
--dv 128 against FA3 built with --hdims 192 --enable HDIMDIFF192) forward 2·B·H·S²·(D + Dv) and
backward 2·B·H·S²·(3·D + 2·Dv), the GEMMs each direction runs. Each point is the median of
--rounds rounds with the providers' order rotated (benchmark_attn.py's timing).

    python benchmarks/benchmark_scoremods.py --rounds 3 --bwd    # writes benchmarks/results/scoremods-<date>.{csv,md}
    python benchmarks/benchmark_scoremods.py --hdims 128 --seqlens 8192 --providers plain,softcap
    python benchmarks/benchmark_scoremods.py --hdims 192 --dv 128 --seqlens 2048,8192,16384 --providers plain,fa3 --bwd
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchmark_attn as ba  # noqa: E402  (timing, rotation, environment)
import rounds  # noqa: E402  (rotated rounds, results files)

HEADS_X_HDIM = 2048
TOKENS = 16384
SOFTCAP = 30.0  # Gemma 2's attn_logit_softcapping


def _ours(softcap: float = 0.0, sink: bool = False, padded: bool = False):
    import flash_attn_hopper

    reason = flash_attn_hopper.unavailable_reason()
    if reason is not None:
        raise ba.ProviderUnavailable(reason)

    def run(q, k, v, causal):
        s = torch.zeros(q.shape[2], device=q.device) if sink else None  # a sink that still joins every row
        dv = v.shape[-1]
        if padded:  # dv != d on v zero-padded to q's head dim and out cut back (what kernels of one width need)
            v = torch.nn.functional.pad(v, (0, q.shape[-1] - dv))
        out = flash_attn_hopper.flash_attn_func(q, k, v, causal=causal, softcap=softcap, learnable_sink=s)
        return out[..., :dv]

    return run


def _fa3(softcap: float = 0.0):
    fa3_func = ba.fa3_function("flash_attn_func")

    def run(q, k, v, causal):
        out = fa3_func(q, k, v, causal=causal, softcap=softcap)
        return out[0] if isinstance(out, tuple) else out

    return run


PROVIDERS = {
    "plain": _ours,
    "softcap": lambda: _ours(softcap=SOFTCAP),
    "sink": lambda: _ours(sink=True),
    "padded": lambda: _ours(padded=True),
    "fa3": _fa3,
    "fa3-softcap": lambda: _fa3(softcap=SOFTCAP),
}
#: The ratios the markdown reports: (provider, the peer it is divided by).
RATIOS = [("softcap", "plain"), ("sink", "plain"), ("softcap", "fa3-softcap"), ("plain", "fa3"), ("plain", "padded")]


@dataclass
class Row:
    provider: str
    hdim: int
    causal: bool
    seqlen: int
    fwd_tflops: float = math.nan
    bwd_tflops: float = math.nan


def flops_of(batch, nheads, seqlen, hdim, dv, causal) -> tuple[float, float]:
    """(forward, backward) FLOPs: S = QK^T and PV forward; S, dP = dO V^T, dV, dK, dQ backward."""
    pairs = batch * nheads * seqlen * seqlen / (2.0 if causal else 1.0)
    return 2.0 * pairs * (hdim + dv), 2.0 * pairs * (3 * hdim + 2 * dv)


def measure(provider, run, hdim, causal, seqlen, args) -> Row:
    row = Row(provider, hdim, causal, seqlen)
    batch, nheads = max(1, TOKENS // seqlen), HEADS_X_HDIM // hdim
    dv = args.dv or hdim
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, seqlen, nheads, d, device="cuda", dtype=torch.bfloat16, generator=gen)
               for d in (hdim, hdim, dv))
    flops, bwd_flops = flops_of(batch, nheads, seqlen, hdim, dv, causal)
    try:
        with torch.no_grad():
            row.fwd_tflops = flops / ba.time_ms(lambda: run(q, k, v, causal), args.warmup, args.rep) / 1e9
        if args.bwd:
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out = run(*leaves, causal)
            dout = torch.randn_like(out)
            ms = ba.time_ms(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True), args.warmup, args.rep)
            row.bwd_tflops = bwd_flops / ms / 1e9
    except Exception as err:  # a failing provider records NaN and the run goes on
        print(f"    {provider} hdim {hdim} causal {causal} seqlen {seqlen} failed: {ba._first_line(err)}", flush=True)
    return row


def markdown(rows: list[Row], env: dict, dv: int = 0) -> str:
    lines = [f"# Score modifiers, {env['date']}", "", f"GPU {env['gpu']}, torch {env['torch']}, "
             f"flash_attn_hopper {env['flash_attn_hopper']}; bf16, {TOKENS} tokens, nheads x hdim = {HEADS_X_HDIM}, "
             f"softcap {SOFTCAP}" + (f"; v's head dim {dv} (hdim is q's and k's)." if dv else "."), "",
             "| hdim | causal | seqlen | provider | fwd TFLOP/s | bwd TFLOP/s |", "|---|---|---|---|---|---|"]
    points: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        points.setdefault((r.hdim, r.causal, r.seqlen), {})[r.provider] = r
        lines.append(f"| {r.hdim} | {str(r.causal).lower()} | {r.seqlen} | {r.provider} | {r.fwd_tflops:.1f} | "
                     f"{r.bwd_tflops:.1f} |")
    lines += ["", "Ratios (throughput of the first over the second; softcap / plain below 1 is its cost):", "",
              "| hdim | causal | seqlen | ratio | fwd | bwd |", "|---|---|---|---|---|---|"]
    for (hdim, causal, seqlen), rs in points.items():
        for a, b in RATIOS:
            if a in rs and b in rs:
                fwd, bwd = (getattr(rs[a], f) / getattr(rs[b], f) for f in ("fwd_tflops", "bwd_tflops"))
                lines.append(f"| {hdim} | {str(causal).lower()} | {seqlen} | {a} / {b} | {fwd:.3f} | {bwd:.3f} |")
    lines += ["", "The median of the rounds, providers rotated; ratios from the same run."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hdims", type=lambda s: [int(x) for x in s.split(",")], default=[64, 128, 256])
    p.add_argument("--seqlens", type=lambda s: [int(x) for x in s.split(",")], default=[512, 2048, 8192, 16384])
    p.add_argument("--providers", default=",".join(p for p in PROVIDERS if p != "padded"))
    p.add_argument("--bwd", action="store_true")
    p.add_argument("--dv", type=int, default=0, help="v's head dim (default: hdim)")
    ba.common_args(p)
    p.add_argument("--out", type=Path, default=None, help="file stem (default results/scoremods-<date>)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 1
    runs = ba.load_providers(PROVIDERS, args.providers.split(","))
    rows, point = [], 0
    for hdim in args.hdims:
        for causal in (False, True):
            for seqlen in args.seqlens:
                medians = rounds.rotated_medians(runs, point, args.rounds,
                                                 lambda n, run: measure(n, run, hdim, causal, seqlen, args),
                                                 ("fwd_tflops", "bwd_tflops"))
                for n, m in medians.items():
                    rows.append(Row(n, hdim, causal, seqlen, m["fwd_tflops"], m["bwd_tflops"]))
                    print(f"hdim {hdim:3d} causal {causal!s:5s} seqlen {seqlen:5d} {n:11s} "
                          f"fwd {rows[-1].fwd_tflops:7.1f} bwd {rows[-1].bwd_tflops:7.1f}", flush=True)
                point += 1
    records = [[r.provider, r.hdim, str(r.causal).lower(), r.seqlen, f"{r.fwd_tflops:.1f}", f"{r.bwd_tflops:.1f}"]
               for r in rows]
    rounds.write_results("scoremods", ["provider", "hdim", "causal", "seqlen", "fwd_tflops", "bwd_tflops"], records,
                         markdown(rows, ba.environment(), args.dv), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
