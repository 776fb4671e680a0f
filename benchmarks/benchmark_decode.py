#!/usr/bin/env python3
"""Decode speed: one query token per sequence over a KV cache, as bytes of K and V read per second
(issue 41's bar), flash_attn_hopper against torch SDPA's cuDNN and flash backends and FA3, measured
in the same run (benchmark_attn.py's timing and rotation).

Grid: batch 1 / 8 / 64 x cache 4k / 32k / 128k (points past --max-cache-gib of K+V skipped) x GQA
32:8 and 8:1 x hdim 64 / 128 / 256, bf16. Providers: flash_attn_hopper (flash_attn_with_kvcache:
split-KV chosen), flash_attn_hopper-nosplit (flash_attn_func on (batch, 1, heads, d) queries, one CTA
per head), sdpa-cudnn, sdpa-flash (enable_gqa), fa3 (flash_attn_with_kvcache when importable); on
request flash_attn_hopper-sN (num_splits=N) and the paged cache: flash_attn_hopper-pagedP and
fa3-pagedP (the same cache as pages of P rows in a random page table). --seqlen-q N > 1 times a causal
chunk of N queries per sequence (prefill against the cache) instead of one. --fp8: q and the cache in
float8_e4m3fn with (batch, nheads_kv) descales (ours and FA3; the bytes read are then one per element).

    python benchmarks/benchmark_decode.py --rounds 3            # results/decode-<date>.{csv,md}
    python benchmarks/benchmark_decode.py --batches 8 --caches 32768 --hdims 128
    python benchmarks/benchmark_decode.py --graph ...   # each call captured in a CUDA graph and replayed

Eager timing includes each provider's host work per call (Python checks, small tensor ops, launches),
which bounds small decode steps; --graph replays a captured call, as serving engines run decode, and
so times the GPU work alone.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchmark_attn as ba  # noqa: E402  (timing, rotation, environment)
import rounds  # noqa: E402  (rotated rounds, results files)
GQA = {"32:8": (32, 8), "8:1": (8, 1)}


def kv_bytes(batch: int, cache: int, heads_kv: int, hdim: int, elem: int = 2) -> int:
    """Bytes of K and V a decode step reads: the whole cache of every sequence, once."""
    return 2 * batch * cache * heads_kv * hdim * elem


_DESCALES: dict = {}


def _descales(q, k) -> dict:
    """FP8 calls' descales, (batch, nheads_kv) per tensor (made once per shape), else none."""
    if q.dtype != torch.float8_e4m3fn:
        return {}
    key = (q.shape[0], k.shape[-2], q.device)
    if key not in _DESCALES:
        _DESCALES[key] = torch.full(key[:2], 0.5, device=q.device)
    return {"q_descale": _DESCALES[key], "k_descale": _DESCALES[key], "v_descale": _DESCALES[key]}


def _ours(split: bool = True, num_splits: int = 0):
    """flash_attn_with_kvcache (split-KV chosen, its default, or at most num_splits), or
    flash_attn_func without splits."""
    import flash_attn_hopper

    reason = flash_attn_hopper.unavailable_reason()
    if reason is not None:
        raise ba.ProviderUnavailable(reason)
    if split:
        return lambda q, k, v: flash_attn_hopper.flash_attn_with_kvcache(q, k, v, num_splits=num_splits,
                                                                         causal=q.shape[1] > 1, **_descales(q, k))
    return lambda q, k, v: flash_attn_hopper.flash_attn_func(q, k, v, causal=q.shape[1] > 1, **_descales(q, k))


def _sdpa(backend_name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)

    def run(q, k, v):
        with sdpa_kernel(backend):
            if q.shape[1] > 1:  # bottom-right causal, as the others
                mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril(k.shape[1] - q.shape[1])
                return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      attn_mask=mask, enable_gqa=q.size(2) != k.size(2))
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  enable_gqa=q.size(2) != k.size(2))

    return run


def _fa3():
    fa3_kvcache = ba.fa3_function("flash_attn_with_kvcache")
    return lambda q, k, v: fa3_kvcache(q, k, v, causal=q.shape[1] > 1, **_descales(q, k))


def _paged(fn, page_size: int):
    """fn over the (batch, cache, hk, d) cache viewed as pages of page_size rows, in the order of a
    random page table (one per shape, made outside the timing)."""
    tables = {}

    def run(q, k, v):
        batch, cache, hk, d = k.shape
        key = (batch, cache, k.device)
        if key not in tables:
            gen = torch.Generator(device=k.device).manual_seed(1)
            pages = torch.randperm(batch * cache // page_size, device=k.device, generator=gen)
            tables[key] = pages.view(batch, -1).to(torch.int32)
        k_pages, v_pages = (t.view(-1, page_size, hk, d) for t in (k, v))
        return fn(q, k_pages, v_pages, page_table=tables[key], causal=q.shape[1] > 1, **_descales(q, k))

    return run


def _ours_paged(page_size: int):
    import flash_attn_hopper

    reason = flash_attn_hopper.unavailable_reason()
    if reason is not None:
        raise ba.ProviderUnavailable(reason)
    return _paged(flash_attn_hopper.flash_attn_with_kvcache, page_size)


PROVIDERS = {"flash_attn_hopper": _ours, "flash_attn_hopper-nosplit": lambda: _ours(split=False),
             "sdpa-cudnn": lambda: _sdpa("CUDNN_ATTENTION"),
             "sdpa-flash": lambda: _sdpa("FLASH_ATTENTION"), "fa3": _fa3}


@dataclass
class Row:
    provider: str
    batch: int
    cache: int
    gqa: str
    hdim: int
    gbps: float = math.nan


def points(batches, caches, gqas, hdims, max_gib: float):
    for hdim in hdims:
        for gqa in gqas:
            for batch in batches:
                for cache in caches:
                    if kv_bytes(batch, cache, GQA[gqa][1], hdim) <= max_gib * 2**30:
                        yield batch, cache, gqa, hdim


def measure(provider, run, batch, cache, gqa, hdim, args) -> Row:
    row = Row(provider, batch, cache, gqa, hdim)
    hq, hk = GQA[gqa]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, args.seqlen_q, hq, hdim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(batch, cache, hk, hdim, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    if args.fp8:
        q, k, v = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    try:
        with torch.no_grad():
            if args.graph:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(3):
                        run(q, k, v)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    run(q, k, v)
                ms = ba.time_ms(graph.replay, args.warmup, args.rep)
                del graph
            else:
                ms = ba.time_ms(lambda: run(q, k, v), args.warmup, args.rep)
        row.gbps = kv_bytes(batch, cache, hk, hdim, k.element_size()) / ms / 1e6
    except Exception as err:  # a failing provider records NaN and the run goes on
        print(f"    {provider} b{batch} cache {cache} {gqa} hdim {hdim} failed: {ba._first_line(err)}", flush=True)
    del q, k, v
    torch.cuda.empty_cache()
    return row


def markdown(rows: list[Row], env: dict, graph: bool = False, seqlen_q: int = 1, fp8: bool = False) -> str:
    providers = list(dict.fromkeys(r.provider for r in rows))
    table = {(r.provider, r.batch, r.cache, r.gqa, r.hdim): r.gbps for r in rows}
    keys = list(dict.fromkeys((r.batch, r.cache, r.gqa, r.hdim) for r in rows))
    out = [f"# Decode (K/V bytes read per second), {env['date']}", "",
           f"GPU {env['gpu']}, torch {env['torch']}, flash_attn_hopper {env['flash_attn_hopper']}. GB/s; "
           + ("one query token per sequence; " if seqlen_q == 1 else f"{seqlen_q} causal queries per sequence; ")
           + ("q and K/V float8_e4m3fn with descales; " if fp8 else "")
           + "median of the rounds, providers rotated; "
           + ("each call captured in a CUDA graph and replayed (GPU work only)." if graph
              else "eager calls (host work per call included)."), "",
           "| batch | cache | GQA | hdim | " + " | ".join(providers) + " | ours / best peer | ours paged / best peer |",
           "|" + "---|" * (len(providers) + 6)]
    for key in keys:
        vals = [table.get((p, *key), math.nan) for p in providers]
        # Ours: the best of our contiguous providers (unsplit, split) and of our paged ones; peers:
        # everyone else's contiguous providers (torch SDPA has no paged cache; FA3's paged ones are
        # in their own columns).
        def best(pick):
            xs = [x for p, x in zip(providers, vals) if pick(p) and not math.isnan(x)]
            return max(xs) if xs else math.nan
        mine = best(lambda p: p.startswith("flash_attn_hopper") and "-paged" not in p)
        mine_paged = best(lambda p: p.startswith("flash_attn_hopper-paged"))
        peer = best(lambda p: not p.startswith("flash_attn_hopper") and "-paged" not in p)
        ratio = lambda x: "" if math.isnan(x) or math.isnan(peer) else f"{x / peer:.2f}"  # noqa: E731
        out.append("| " + " | ".join(map(str, key)) + " | " + " | ".join(f"{x:.0f}" for x in vals)
                   + f" | {ratio(mine)} | {ratio(mine_paged)} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=ints, default=[1, 8, 64])
    p.add_argument("--caches", type=ints, default=[4096, 32768, 131072])
    p.add_argument("--gqa", default="32:8,8:1")
    p.add_argument("--hdims", type=ints, default=[64, 128, 256])
    p.add_argument("--providers", default=",".join(PROVIDERS))
    p.add_argument("--max-cache-gib", type=float, default=40.0, help="skip points whose K+V exceed this")
    ba.common_args(p)
    p.add_argument("--graph", action="store_true", help="time CUDA-graph replays of each call (no host work)")
    p.add_argument("--seqlen-q", type=int, default=1, help="queries per sequence (> 1: a causal prefill chunk)")
    p.add_argument("--fp8", action="store_true", help="q and the cache in float8_e4m3fn, with descales")
    p.add_argument("--out", type=Path, default=None, help="file stem (default results/decode-<date>)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 1
    # flash_attn_hopper-sN: flash_attn_with_kvcache with num_splits=N (a sweep of the split plan).
    table = dict(PROVIDERS)
    for name in args.providers.split(","):
        if name.startswith("flash_attn_hopper-s") and name[len("flash_attn_hopper-s"):].isdigit():
            table[name] = (lambda n: lambda: _ours(num_splits=n))(int(name[len("flash_attn_hopper-s"):]))
    for name in args.providers.split(","):
        for prefix, make in (("flash_attn_hopper-paged", _ours_paged),
                             ("fa3-paged", lambda n: _paged(ba.fa3_function("flash_attn_with_kvcache"), n))):
            if name.startswith(prefix) and name[len(prefix):].isdigit():
                table[name] = (lambda n, make=make: lambda: make(n))(int(name[len(prefix):]))
    runs = ba.load_providers(table, args.providers.split(","))
    rows = []
    for i, (batch, cache, gqa, hdim) in enumerate(points(args.batches, args.caches, args.gqa.split(","), args.hdims,
                                                        args.max_cache_gib)):
        medians = rounds.rotated_medians(runs, i, args.rounds,
                                         lambda n, run: measure(n, run, batch, cache, gqa, hdim, args), ("gbps",))
        for n, m in medians.items():
            rows.append(Row(n, batch, cache, gqa, hdim, m["gbps"]))
            print(f"b{batch:<3d} cache {cache:<7d} {gqa:5s} hdim {hdim:3d} {n:18s} {rows[-1].gbps:8.0f} GB/s", flush=True)
    records = [[r.provider, r.batch, r.cache, r.gqa, r.hdim, f"{r.gbps:.1f}"] for r in rows]
    rounds.write_results("decode", ["provider", "batch", "cache", "gqa", "hdim", "gbps"], records,
                         markdown(rows, ba.environment(), args.graph, args.seqlen_q, args.fp8), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
