#!/usr/bin/env python3
"""Variable-length attention speed: flash_attn_varlen_func against our dense kernels on the same
shapes and against FlashAttention-3's varlen, measured in the same run (issue 40's bar).

Cases (bf16, nheads x hdim = 2048, 16k tokens):
- equal lengths: 8 x 2k and 2 x 8k at hdim 64 / 128 / 256, causal and not; providers
  varlen (ours, packed), dense (ours, flash_attn_func on (batch, seqlen, ...)), fa3-varlen;
- ragged (hdim 128, causal and not): 32 sequences with lengths uniform in [1, 4k], and one 16k
  sequence among 64 short ones (uniform in [16, 512]); providers varlen and fa3-varlen.
FLOPs count the (query, key) pairs each sequence attends (causal: bottom-right, exact), forward
4·H·D per pair, backward 2.5x forward. Each point is the median of --rounds rounds with the
providers' order rotated (benchmark_attn.py's method and timing).

    python benchmarks/benchmark_varlen.py --rounds 3 --bwd      # writes benchmarks/results/varlen-<date>.{csv,md}
    python benchmarks/benchmark_varlen.py --cases ragged --hdims 128
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


@dataclass(frozen=True)
class Case:
    name: str
    lengths: tuple[int, ...]
    ragged: bool


def cases(which: str, seed: int = 0) -> list[Case]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    if which in ("all", "equal"):
        out += [Case("8x2k", (2048,) * 8, False), Case("2x8k", (8192,) * 2, False)]
    if which in ("all", "ragged"):
        uniform = torch.randint(1, 4097, (32,), generator=gen).tolist()
        short = torch.randint(16, 513, (64,), generator=gen).tolist()
        out += [Case("32 x U[1,4k]", tuple(uniform), True), Case("16k + 64 x U[16,512]", (16384, *short), True)]
    return out


def attended_pairs(lengths, causal: bool) -> int:
    """(query, key) pairs with seqlen_q == seqlen_k per sequence; causal: n (n + 1) / 2."""
    return sum(n * (n + 1) // 2 if causal else n * n for n in lengths)


def _ours_varlen(deterministic=False):
    import flash_attn_hopper

    reason = flash_attn_hopper.unavailable_reason()
    if reason is not None:
        raise ba.ProviderUnavailable(reason)
    return lambda q, k, v, cu, max_len, causal: flash_attn_hopper.flash_attn_varlen_func(
        q, k, v, cu, cu, max_len, max_len, causal=causal, deterministic=deterministic)


def _fa3_varlen():
    fa3_varlen = ba.fa3_function("flash_attn_varlen_func")

    def run(q, k, v, cu, max_len, causal):
        out = fa3_varlen(q, k, v, cu, cu, max_len, max_len, causal=causal)
        return out[0] if isinstance(out, tuple) else out

    return run


def _ours_dense():
    dense = ba.PROVIDERS["flash_attn_hopper"]()

    def run(q, k, v, cu, max_len, causal):  # equal lengths only: the packed rows as (batch, seqlen)
        batch = cu.numel() - 1
        shape = (batch, q.shape[0] // batch, *q.shape[1:])
        return dense(q.view(shape), k.view(shape), v.view(shape), causal).reshape(q.shape)

    return run


PROVIDERS = {"varlen": _ours_varlen, "dense": _ours_dense, "fa3-varlen": _fa3_varlen}


@dataclass
class Row:
    provider: str
    case: str
    hdim: int
    causal: bool
    fwd_tflops: float = math.nan
    bwd_tflops: float = math.nan


def measure(provider, run, case: Case, hdim, causal, args) -> Row:
    row = Row(provider, case.name, hdim, causal)
    nheads = HEADS_X_HDIM // hdim
    total = sum(case.lengths)
    cu = torch.tensor([0, *torch.tensor(case.lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(total, nheads, hdim, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    flops = 4.0 * nheads * hdim * attended_pairs(case.lengths, causal)
    max_len = max(case.lengths)
    try:
        with torch.no_grad():
            ms = ba.time_ms(lambda: run(q, k, v, cu, max_len, causal), args.warmup, args.rep)
        row.fwd_tflops = flops / ms / 1e9
        if args.bwd:
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            out = run(qg, kg, vg, cu, max_len, causal)
            dout = torch.randn_like(out)
            ms = ba.time_ms(lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True), args.warmup, args.rep)
            row.bwd_tflops = 2.5 * flops / ms / 1e9
    except Exception as err:  # a failing provider records NaN and the run goes on
        print(f"    {provider} {case.name} hdim {hdim} causal {causal} failed: {ba._first_line(err)}", flush=True)
    return row


def markdown(rows: list[Row], env: dict) -> str:
    lines = [f"# Varlen attention, {env['date']}", "", f"GPU {env['gpu']}, torch {env['torch']}, "
             f"flash_attn_hopper {env['flash_attn_hopper']}.", "",
             "| case | hdim | causal | provider | fwd TFLOP/s | bwd TFLOP/s | fwd / peer | bwd / peer |",
             "|---|---|---|---|---|---|---|---|"]
    by_point: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        by_point.setdefault((r.case, r.hdim, r.causal), {})[r.provider] = r
    def ratio(a: float, b: float) -> str:
        return f"{a / b:.3f}" if a == a and b == b and b > 0 else ""

    for (case, hdim, causal), rs in by_point.items():
        peer = rs.get("dense") or rs.get("fa3-varlen")
        for name, r in rs.items():
            fwd = ratio(r.fwd_tflops, peer.fwd_tflops) if peer is not None and name == "varlen" else ""
            bwd = ratio(r.bwd_tflops, peer.bwd_tflops) if peer is not None and name == "varlen" else ""
            lines.append(f"| {case} | {hdim} | {str(causal).lower()} | {name} | {r.fwd_tflops:.1f} | "
                         f"{r.bwd_tflops:.1f} | {fwd} | {bwd} |")
    lines += ["", "Peer: our dense kernels on equal lengths, FA3's varlen on ragged batches; the median of the "
              "rounds, providers rotated."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", choices=["all", "equal", "ragged"], default="all")
    p.add_argument("--hdims", type=lambda s: [int(x) for x in s.split(",")], default=[64, 128, 256])
    p.add_argument("--providers", default=",".join(PROVIDERS))
    p.add_argument("--bwd", action="store_true")
    ba.common_args(p)
    p.add_argument("--out", type=Path, default=None, help="file stem (default results/varlen-<date>)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 1
    runs = ba.load_providers(PROVIDERS, args.providers.split(","))
    rows = []
    point = 0
    for case in cases(args.cases):
        for hdim in ([128] if case.ragged else args.hdims):
            for causal in (False, True):
                names = {n: r for n, r in runs.items() if not (n == "dense" and case.ragged)}
                medians = rounds.rotated_medians(names, point, args.rounds,
                                                 lambda n, run: measure(n, run, case, hdim, causal, args),
                                                 ("fwd_tflops", "bwd_tflops"))
                for n, m in medians.items():
                    rows.append(Row(n, case.name, hdim, causal, m["fwd_tflops"], m["bwd_tflops"]))
                    print(f"{case.name:22s} hdim {hdim:3d} causal {causal!s:5s} {n:11s} "
                          f"fwd {rows[-1].fwd_tflops:7.1f} bwd {rows[-1].bwd_tflops:7.1f}", flush=True)
                point += 1
    records = [[r.provider, r.case, r.hdim, str(r.causal).lower(), f"{r.fwd_tflops:.1f}", f"{r.bwd_tflops:.1f}"]
               for r in rows]
    rounds.write_results("varlen", ["provider", "case", "hdim", "causal", "fwd_tflops", "bwd_tflops"], records,
                         markdown(rows, ba.environment()), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
