#!/usr/bin/env python3
"""MLA decode (FA3's qv): one query token per sequence, 128 query heads on one latent KV head,
q / k head dim 64 and v / qv head dim 512 (DeepSeek's), as bytes of the cache read per second,
CUDA-graph replays (serving engines run decode that way), median of rotated rounds.

Providers: flash_attn_hopper (flash_attn_with_kvcache with qv over a contiguous cache, split-KV
chosen), flash_attn_hopper-pagedP (one latent cache (pages, P, 1, 576) viewed as v = its first 512
columns and k = the last 64, pages in a random order: vLLM's call), fa3 / fa3-pagedP (FA3's
flash_attn_with_kvcache, where its build has the d 64 / dv 512 kernels).

    python benchmarks/benchmark_mla.py --rounds 3      # results/mla-<date>.{csv,md}
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

HEADS, D, DV = 128, 64, 512


def _kvcache(fn, page_size: int | None):
    """fn(q, k_cache, v_cache, qv=...) over a latent cache (batch * cache rows of d + dv), contiguous
    or as pages of page_size rows in a random page table."""

    tables = {}  # made by the first (uncaptured) call of a shape

    def run(q, qv, latent, lens):
        batch, cache = lens.numel(), latent.shape[0] // lens.numel()
        if page_size is None:
            rows = latent.view(batch, cache, 1, D + DV)
            return fn(q, rows[..., DV:], rows[..., :DV], qv=qv, cache_seqlens=lens, causal=True)
        pages = latent.view(-1, page_size, 1, D + DV)
        if (batch, cache) not in tables:
            gen = torch.Generator(device=latent.device).manual_seed(1)
            perm = torch.randperm(pages.shape[0], device=latent.device, generator=gen)
            tables[batch, cache] = perm.view(batch, -1).to(torch.int32)
        return fn(q, pages[..., DV:], pages[..., :DV], qv=qv, cache_seqlens=lens, page_table=tables[batch, cache],
                  causal=True)

    return run


def _ours(page_size=None):
    import flash_attn_hopper

    reason = flash_attn_hopper.unavailable_reason()
    if reason is not None:
        raise ba.ProviderUnavailable(reason)
    return _kvcache(flash_attn_hopper.flash_attn_with_kvcache, page_size)


def _fa3(page_size=None):
    return _kvcache(ba.fa3_function("flash_attn_with_kvcache"), page_size)


PROVIDERS = {"flash_attn_hopper": _ours, "flash_attn_hopper-paged64": lambda: _ours(64),
             "flash_attn_hopper-paged1": lambda: _ours(1), "fa3": _fa3, "fa3-paged64": lambda: _fa3(64)}


@dataclass
class Row:
    provider: str
    batch: int
    cache: int
    gbps: float = math.nan


def measure(provider, run, batch, cache, args) -> Row:
    row = Row(provider, batch, cache)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, 1, HEADS, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    qv = torch.randn(batch, 1, HEADS, DV, device="cuda", dtype=torch.bfloat16, generator=gen)
    latent = torch.randn(batch * cache, D + DV, device="cuda", dtype=torch.bfloat16, generator=gen)
    lens = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
    try:
        with torch.no_grad():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    run(q, qv, latent, lens)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run(q, qv, latent, lens)
            ms = ba.time_ms(graph.replay, args.warmup, args.rep)
            del graph
        row.gbps = batch * cache * (D + DV) * 2 / ms / 1e6
    except Exception as err:  # a failing provider records NaN and the run goes on
        print(f"    {provider} b{batch} cache {cache} failed: {ba._first_line(err)}", flush=True)
    del q, qv, latent
    torch.cuda.empty_cache()
    return row


def markdown(rows: list[Row], env: dict) -> str:
    providers = list(dict.fromkeys(r.provider for r in rows))
    table = {(r.provider, r.batch, r.cache): r.gbps for r in rows}
    keys = list(dict.fromkeys((r.batch, r.cache) for r in rows))
    out = [f"# MLA decode (qv; cache bytes read per second), {env['date']}", "",
           f"GPU {env['gpu']}, torch {env['torch']}, flash_attn_hopper {env['flash_attn_hopper']}. GB/s of the "
           f"latent cache ({D} + {DV} columns per token); {HEADS} query heads on one KV head, one query per "
           "sequence, causal; CUDA-graph replays, median of the rounds, providers rotated.", "",
           "| batch | cache | " + " | ".join(providers) + " |", "|" + "---|" * (len(providers) + 2)]
    for key in keys:
        out.append("| " + " | ".join(map(str, key)) + " | "
                   + " | ".join(f"{table.get((p, *key), math.nan):.0f}" for p in providers) + " |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=ints, default=[8, 32, 128])
    p.add_argument("--caches", type=ints, default=[4096, 16384])
    p.add_argument("--providers", default=",".join(PROVIDERS))
    ba.common_args(p)
    p.add_argument("--out", type=Path, default=None, help="file stem (default results/mla-<date>)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 1
    runs = ba.load_providers(PROVIDERS, args.providers.split(","))
    rows = []
    for i, (batch, cache) in enumerate((b, c) for b in args.batches for c in args.caches):
        medians = rounds.rotated_medians(runs, i, args.rounds, lambda n, run: measure(n, run, batch, cache, args),
                                         ("gbps",))
        for n, m in medians.items():
            rows.append(Row(n, batch, cache, m["gbps"]))
            print(f"b{batch:<3d} cache {cache:<6d} {n:26s} {rows[-1].gbps:8.0f} GB/s", flush=True)
    rounds.write_results("mla", ["provider", "batch", "cache", "gbps"],
                         [[r.provider, r.batch, r.cache, f"{r.gbps:.1f}"] for r in rows],
                         markdown(rows, ba.environment()), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
