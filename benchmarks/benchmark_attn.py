#!/usr/bin/env python3
"""Attention speed on one GPU: flash_attn_hopper against its peers, measured in the same run.

Method (shared/BENCHMARKS.md, the FlashAttention-3 paper's): bf16, batch x seqlen =
16,384 tokens, nheads x hdim = 2048, seqlen_q = seqlen_k, random normal inputs.
FLOPs: forward 4·B·H·S²·D, halved when causal; backward 2.5 x forward. Time: median
of triton.testing.do_bench (CUDA events) after warm-up; backward is timed as
torch.autograd.grad of the output. Providers run in an order rotated per grid point; with
--rounds N each point is measured N times (the order rotated per round too) and each
provider's median is reported, which keeps single points from moving by run-to-run noise.

Providers: flash_attn_hopper, sdpa-cudnn and sdpa-flash (torch SDPA forced to one
backend), fa3 (FlashAttention-3's flash_attn_interface, when importable). A provider
that fails at a point records NaN there and the run goes on.

Writes benchmarks/results/latest.csv, latest.md (our ratio to each peer of this run,
and to the FA3 numbers of BENCHMARKS.md as a labelled reference; each provider's slowest and
fastest round, the median SM clock and board power while each provider's timing runs, through NVML)
and latest.png.

    python benchmarks/benchmark_attn.py                       # the full grid, forward
    python benchmarks/benchmark_attn.py --hdims 128 --seqlens 8192 --causal no --bwd
    python benchmarks/benchmark_attn.py --bwd --rounds 3          # the grid the README reports
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import platform
import statistics
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_state import Sampler, gpu_state  # noqa: E402,F401  (gpu_state: the other benchmarks read it here)
from gpu_state import median_finite as _median_finite  # noqa: E402

TOKENS = 16384
HEADS_X_HDIM = 2048
DEFAULT_HDIMS = (64, 128, 256)
DEFAULT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
CSV_COLUMNS = ["provider", "dtype", "hdim", "causal", "seqlen", "batch", "nheads", "fwd_tflops", "bwd_tflops",
               "fwd_min", "fwd_max", "bwd_min", "bwd_max", "sm_mhz", "power_w"]
PROVIDER_ORDER = ["flash_attn_hopper", "sdpa-cudnn", "sdpa-flash", "fa3", "flash_attn_hopper-det"]
# Run only when asked for (--providers): ours with deterministic=True, to report the backward's
# deterministic-mode cost beside the default in the same run.
OPT_IN_PROVIDERS = ["flash_attn_hopper-det"]

# shared/BENCHMARKS.md, first table ("one run, three peers", H200, 2026-11-29): bf16 TFLOP/s,
# keyed by (hdim, causal, seqlen) -> (FA3 fwd, best fwd, FA3 bwd, best bwd). "best" is the
# fastest of FA3, FA4 and cuDNN at that point. A yardstick from another run, not this one.
BENCHMARKS_MD_REFERENCE = {
    (64, False, 512): (252, 388, 330, 330),
    (64, False, 1024): (384, 436, 428, 428),
    (64, False, 2048): (497, 497, 476, 479),
    (64, False, 4096): (522, 522, 507, 518),
    (64, False, 8192): (552, 552, 526, 529),
    (64, False, 16384): (538, 545, 524, 535),
    (64, True, 512): (222, 253, 170, 215),
    (64, True, 1024): (300, 336, 303, 322),
    (64, True, 2048): (421, 421, 408, 410),
    (64, True, 4096): (485, 485, 506, 506),
    (64, True, 8192): (538, 538, 563, 563),
    (64, True, 16384): (523, 523, 546, 546),
    (128, False, 512): (509, 516, 353, 360),
    (128, False, 1024): (627, 627, 468, 476),
    (128, False, 2048): (682, 682, 539, 549),
    (128, False, 4096): (721, 721, 566, 580),
    (128, False, 8192): (699, 699, 597, 608),
    (128, False, 16384): (704, 704, 614, 623),
    (128, True, 512): (317, 322, 218, 244),
    (128, True, 1024): (478, 478, 352, 361),
    (128, True, 2048): (597, 597, 474, 474),
    (128, True, 4096): (681, 681, 519, 519),
    (128, True, 8192): (715, 715, 610, 610),
    (128, True, 16384): (688, 688, 580, 598),
    (256, False, 512): (432, 510, 293, 293),
    (256, False, 1024): (669, 669, 357, 357),
    (256, False, 2048): (749, 749, 386, 386),
    (256, False, 4096): (771, 771, 408, 408),
    (256, False, 8192): (806, 806, 437, 437),
    (256, False, 16384): (784, 812, 452, 452),
    (256, True, 512): (335, 335, 200, 200),
    (256, True, 1024): (484, 484, 293, 293),
    (256, True, 2048): (614, 614, 341, 341),
    (256, True, 4096): (711, 711, 430, 430),
    (256, True, 8192): (763, 763, 410, 417),
    (256, True, 16384): (779, 789, 442, 442),
}


# --------------------------------------------------------------------------
# Providers: each turns BSHD tensors into a callable forward
# --------------------------------------------------------------------------


class ProviderUnavailable(RuntimeError):
    """The provider cannot run this point at all (not an error of the run)."""


def _flash_attn_hopper(deterministic: bool = False):
    import flash_attn_hopper

    reason = flash_attn_hopper.unavailable_reason()
    if reason is not None:
        raise ProviderUnavailable(reason)
    return lambda q, k, v, causal: flash_attn_hopper.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)


def _sdpa(backend_name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)

    def run(q, k, v, causal):
        # BSHD -> BHSD views, the usual way to call SDPA on FlashAttention-layout tensors.
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
        return out.transpose(1, 2)

    return run


def fa3_function(name: str):
    """FlashAttention-3's ``name`` from flash_attn_interface (or the flash_attn_3 package)."""
    import importlib

    for module in ("flash_attn_interface", "flash_attn_3.flash_attn_interface"):
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            last = err
    raise ProviderUnavailable(f"FlashAttention-3 is not importable ({last})")


def _fa3():
    fa3_func = fa3_function("flash_attn_func")

    def run(q, k, v, causal):
        out = fa3_func(q, k, v, causal=causal)
        return out[0] if isinstance(out, tuple) else out

    return run


PROVIDERS = {
    "flash_attn_hopper": _flash_attn_hopper,
    "sdpa-cudnn": lambda: _sdpa("CUDNN_ATTENTION"),
    "sdpa-flash": lambda: _sdpa("FLASH_ATTENTION"),
    "fa3": _fa3,
    "flash_attn_hopper-det": lambda: _flash_attn_hopper(deterministic=True),
}


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


def time_ms(fn, warmup: int, rep: int) -> float:
    """Median milliseconds of fn() on the GPU."""
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    if do_bench is not None:
        return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(max(10, rep // 5)):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def fwd_flops(batch, nheads, seqlen, hdim, causal) -> float:
    return 4.0 * batch * nheads * seqlen * seqlen * hdim / (2.0 if causal else 1.0)


@dataclass
class Row:
    provider: str
    dtype: str
    hdim: int
    causal: bool
    seqlen: int
    batch: int
    nheads: int
    fwd_tflops: float = math.nan
    bwd_tflops: float = math.nan
    # Over the rounds (combine_rounds): the slowest and fastest round, and the median SM clock (MHz)
    # and board power (W) sampled while the provider's timing loops run (gpu_state.Sampler).
    fwd_min: float = math.nan
    fwd_max: float = math.nan
    bwd_min: float = math.nan
    bwd_max: float = math.nan
    sm_mhz: float = math.nan
    power_w: float = math.nan


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:160] if text else ''}"


def measure_point(provider, run, dtype, hdim, causal, seqlen, args) -> Row:
    batch, nheads = TOKENS // seqlen, HEADS_X_HDIM // hdim
    row = Row(provider, args.dtype, hdim, causal, seqlen, batch, nheads)
    flops = fwd_flops(batch, nheads, seqlen, hdim, causal)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, seqlen, nheads, hdim, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
    sampler = Sampler()  # the clock and power while this provider's timing loops run
    try:
        with torch.no_grad(), sampler:
            ms = time_ms(lambda: run(q, k, v, causal), args.warmup, args.rep)
        row.fwd_tflops = flops / ms / 1e9
    except Exception as err:  # a failing provider records NaN and the run goes on
        print(f"    {provider} forward failed: {_first_line(err)}", flush=True)
        if args.verbose:
            traceback.print_exc()
    if args.bwd:
        try:
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            out = run(qg, kg, vg, causal)
            dout = torch.randn_like(out)
            with Sampler() as bwd_sampler:
                ms = time_ms(lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True),
                             args.warmup, args.rep)
            sampler.samples += bwd_sampler.samples
            row.bwd_tflops = 2.5 * flops / ms / 1e9
        except Exception as err:
            print(f"    {provider} backward failed: {_first_line(err)}", flush=True)
            if args.verbose:
                traceback.print_exc()
    row.sm_mhz, row.power_w = sampler.median()
    return row


def load_providers(table: dict, names: list[str]) -> dict:
    """{name: run} of the providers in ``names`` that can run here; says why for the others."""
    runs = {}
    for name in names:
        try:
            runs[name] = table[name]()
        except ProviderUnavailable as err:
            print(f"{name}: unavailable ({err})")
    return runs


def common_args(parser, default_rounds: int = 3) -> None:
    """The timing arguments every benchmark script takes."""
    parser.add_argument("--rounds", type=int, default=default_rounds)
    parser.add_argument("--warmup", type=int, default=25)
    parser.add_argument("--rep", type=int, default=100)


def round_orders(providers: list[str], point: int, rounds: int) -> list[list[str]]:
    """The provider order of each round at grid point `point`: rotated by one per round and per
    point, so that no provider always runs first (after another's allocations, clocks, L2 state)."""
    n = len(providers)
    return [[providers[(point + r + j) % n] for j in range(n)] for r in range(rounds)]


def _extreme(values: list[float], pick) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return pick(finite) if finite else math.nan


def combine_rounds(rows: list[Row]) -> Row:
    """One provider's rounds at one grid point as one row: the median of each direction's
    finite measurements (NaN where every round failed), the slowest and fastest round, and the
    median clock and power."""
    first = rows[0]
    fwd, bwd = [r.fwd_tflops for r in rows], [r.bwd_tflops for r in rows]
    return Row(first.provider, first.dtype, first.hdim, first.causal, first.seqlen, first.batch, first.nheads,
               _median_finite(fwd), _median_finite(bwd), _extreme(fwd, min), _extreme(fwd, max),
               _extreme(bwd, min), _extreme(bwd, max), _median_finite([r.sm_mhz for r in rows]),
               _median_finite([r.power_w for r in rows]))


def accuracy_check(runs: dict, dtype, hdims, causals) -> dict:
    """Relative L2 error of each provider's forward against the float32 reference, at a small size."""
    from reference import attention_ref

    errors = {}
    for hdim in hdims:
        for causal in causals:
            gen = torch.Generator(device="cuda").manual_seed(1)
            q, k, v = (torch.randn(2, 1024, 8, hdim, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
            ref, _ = attention_ref(q, k, v, causal=causal)
            for provider, run in runs.items():
                try:
                    with torch.no_grad():
                        out = run(q, k, v, causal).float()
                    errors[(provider, hdim, causal)] = ((out - ref).norm() / ref.norm()).item()
                except Exception as err:
                    print(f"    accuracy check: {provider} hdim {hdim} causal={causal} failed: {_first_line(err)}")
                    errors[(provider, hdim, causal)] = math.nan
    return errors


# --------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------


def environment() -> dict:
    props = torch.cuda.get_device_properties(0)
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": f"{props.name} ({props.multi_processor_count} SMs, sm_{props.major}{props.minor})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": str(torch.backends.cudnn.version()),
        "python": platform.python_version(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = "not installed (CUDA-event timing)"
    try:
        import flash_attn_hopper

        info = flash_attn_hopper.build_info()
        compiled = ", ".join(f"{c['direction']} hdim{c['hdim']} {c['dtype']}" for c in info.get("compiled", []))
        env["flash_attn_hopper"] = f"{info['version']} (compiled: {compiled or 'unknown'})"
    except Exception as err:
        env["flash_attn_hopper"] = f"not importable ({_first_line(err)})"
    return env


def write_csv(rows: list[Row], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for r in rows:
            writer.writerow(
                [r.provider, r.dtype, r.hdim, str(r.causal).lower(), r.seqlen, r.batch, r.nheads,
                 *(f"{x:.1f}" for x in (r.fwd_tflops, r.bwd_tflops, r.fwd_min, r.fwd_max, r.bwd_min, r.bwd_max)),
                 f"{r.sm_mhz:.0f}", f"{r.power_w:.0f}"]
            )


def _fmt(x: float, digits=0) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def _ratio(a: float, b: float) -> str:
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b == 0:
        return "–"
    return f"{a / b:.2f}"


def markdown(rows: list[Row], env: dict, args, errors: dict, providers: list[str]) -> str:
    table = {(r.provider, r.hdim, r.causal, r.seqlen): r for r in rows}
    points = sorted({(r.hdim, r.causal, r.seqlen) for r in rows})
    peers = [p for p in providers if p != "flash_attn_hopper"]
    out = [
        "# flash_attn_hopper benchmark",
        "",
        f"- date: {env['date']}",
        f"- GPU: {env['gpu']}",
        f"- torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, triton {env['triton']}, "
        f"Python {env['python']}",
        f"- flash_attn_hopper {env['flash_attn_hopper']}",
        f"- command: `python benchmarks/benchmark_attn.py {' '.join(args.argv)}`",
        "",
        f"Method: {args.dtype}, batch x seqlen = {TOKENS} tokens, nheads x hdim = {HEADS_X_HDIM}, seqlen_q = seqlen_k; "
        "forward FLOPs 4·B·H·S²·D (halved when causal), backward 2.5x; median of triton.testing.do_bench"
        + (f", then the median of {args.rounds} rounds" if args.rounds > 1 else "")
        + "; providers in an order rotated per point and round. "
        "TFLOP/s; ratios are flash_attn_hopper / peer (> 1 means we are faster). "
        "\"BMD\" columns are FA3 and the best of FA3/FA4/cuDNN from shared/BENCHMARKS.md's first table "
        "(another run on our H200, 2026-11-29): a yardstick, not part of this run.",
    ]
    directions = ["fwd"] + (["bwd"] if args.bwd else [])
    for direction in directions:
        attr = f"{direction}_tflops"
        ref_index = (0, 1) if direction == "fwd" else (2, 3)
        header = ["hdim", "causal", "seqlen", "batch×heads", "**ours**", *peers]
        header += [f"ours/{p}" for p in peers] + ["FA3 (BMD)", "ours/FA3 (BMD)", "best (BMD)", "ours/best (BMD)"]
        out += ["", f"## {'Forward' if direction == 'fwd' else 'Backward'}", "",
                "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for hdim, causal, seqlen in points:
            ours_row = table.get(("flash_attn_hopper", hdim, causal, seqlen))
            ours = getattr(ours_row, attr) if ours_row else math.nan
            peer_vals = [getattr(table[(p, hdim, causal, seqlen)], attr) if (p, hdim, causal, seqlen) in table
                         else math.nan for p in peers]
            ref = BENCHMARKS_MD_REFERENCE.get((hdim, causal, seqlen))
            fa3_ref = ref[ref_index[0]] if ref and args.dtype == "bf16" else math.nan
            best_ref = ref[ref_index[1]] if ref and args.dtype == "bf16" else math.nan
            any_row = next(r for r in rows if (r.hdim, r.causal, r.seqlen) == (hdim, causal, seqlen))
            cells = [str(hdim), "yes" if causal else "no", str(seqlen), f"{any_row.batch}×{any_row.nheads}",
                     f"**{_fmt(ours)}**", *(_fmt(x) for x in peer_vals), *(_ratio(ours, x) for x in peer_vals),
                     _fmt(fa3_ref), _ratio(ours, fa3_ref), _fmt(best_ref), _ratio(ours, best_ref)]
            out.append("| " + " | ".join(cells) + " |")
        out += ["", *summary_lines(rows, peers, attr, ref_index, args.dtype)]
    out += ["", *spread_lines(rows, providers, directions)]
    if errors:
        out += ["", "## Accuracy (relative L2 error vs float32 reference, batch 2, seqlen 1024, 8 heads)", "",
                "| provider | hdim | causal | rel. L2 error |", "|---|---|---|---|"]
        for (provider, hdim, causal), err in sorted(errors.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
            out.append(f"| {provider} | {hdim} | {'yes' if causal else 'no'} | {_fmt(err, 2) if math.isnan(err) else f'{err:.1e}'} |")
    return "\n".join(out) + "\n"


def spread_lines(rows: list[Row], providers: list[str], directions: list[str]) -> list[str]:
    """Per provider: the widest gap between its slowest and fastest round at one point (the
    run-to-run spread a ratio must beat), and the median SM clock and board power over the points."""
    out = ["## Spread and clocks", "",
           "| provider | " + " | ".join(f"{d} max spread (max/min - 1)" for d in directions)
           + " | SM clock (MHz, median) | power (W, median) |",
           "|" + "---|" * (len(directions) + 3)]
    for p in providers:
        mine = [r for r in rows if r.provider == p]
        cells = []
        for d in directions:
            gaps = [getattr(r, f"{d}_max") / getattr(r, f"{d}_min") - 1 for r in mine
                    if getattr(r, f"{d}_min") > 0 and not math.isnan(getattr(r, f"{d}_max"))]
            cells.append(f"{max(gaps):.1%}" if gaps else "n/a")
        cells += [_fmt(_median_finite([r.sm_mhz for r in mine])), _fmt(_median_finite([r.power_w for r in mine]))]
        out.append(f"| {p} | " + " | ".join(cells) + " |")
    return out


def summary_lines(rows, peers, attr, ref_index, dtype) -> list[str]:
    ours = {(r.hdim, r.causal, r.seqlen): getattr(r, attr) for r in rows if r.provider == "flash_attn_hopper"}
    lines = []
    comparisons = [(p, {(r.hdim, r.causal, r.seqlen): getattr(r, attr) for r in rows if r.provider == p}) for p in peers]
    if dtype == "bf16":
        comparisons.append(("FA3 (BMD)", {k: v[ref_index[0]] for k, v in BENCHMARKS_MD_REFERENCE.items()}))
        comparisons.append(("best (BMD)", {k: v[ref_index[1]] for k, v in BENCHMARKS_MD_REFERENCE.items()}))
    for name, theirs in comparisons:
        shared = [p for p in ours if p in theirs and not math.isnan(theirs[p]) and theirs[p] > 0]
        ratios = [ours[p] / theirs[p] for p in shared if not math.isnan(ours[p])]
        missing = len(shared) - len(ratios)
        if not shared:
            continue
        line = f"- vs {name}: "
        if ratios:
            wins = sum(r >= 1.0 for r in ratios)
            line += (f"≥ 1.00x at {wins}/{len(ratios)} points; ratio min {min(ratios):.2f}, "
                     f"geomean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}, max {max(ratios):.2f}")
        if missing:
            line += f"{'; ' if ratios else ''}flash_attn_hopper has no result at {missing} point(s)"
        lines.append(line)
    return lines


def plot(rows: list[Row], path: Path, providers: list[str], bwd: bool, dtype: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return False
    hdims = sorted({r.hdim for r in rows})
    causals = sorted({r.causal for r in rows})
    directions = ["fwd"] + (["bwd"] if bwd else [])
    panels = [(d, c) for d in directions for c in causals]
    fig, axes = plt.subplots(len(panels), len(hdims), figsize=(4.2 * len(hdims), 3.4 * len(panels)), squeeze=False)
    for i, (direction, causal) in enumerate(panels):
        for j, hdim in enumerate(hdims):
            ax = axes[i][j]
            for provider in providers:
                pts = sorted((r.seqlen, getattr(r, f"{direction}_tflops")) for r in rows
                             if r.provider == provider and r.hdim == hdim and r.causal == causal)
                if pts and not all(math.isnan(y) for _, y in pts):
                    ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=provider,
                            linewidth=2.5 if provider == "flash_attn_hopper" else 1.2)
            if dtype == "bf16":
                seqlens = sorted({r.seqlen for r in rows})
                idx = 0 if direction == "fwd" else 2
                ref = [(s, BENCHMARKS_MD_REFERENCE[(hdim, causal, s)][idx]) for s in seqlens
                       if (hdim, causal, s) in BENCHMARKS_MD_REFERENCE]
                if ref:
                    ax.plot([x for x, _ in ref], [y for _, y in ref], linestyle="--", color="gray",
                            label="FA3 (BENCHMARKS.md)")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{direction} hdim {hdim} {'causal' if causal else 'non-causal'}")
            ax.set_xlabel("seqlen")
            ax.set_ylabel("TFLOP/s")
            ax.grid(True, alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hdims", type=_int_list, default=list(DEFAULT_HDIMS), help="e.g. 64,128,256")
    p.add_argument("--seqlens", type=_int_list, default=list(DEFAULT_SEQLENS), help="e.g. 512,1024,8192")
    p.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    p.add_argument("--bwd", action="store_true", help="also time the backward pass")
    p.add_argument("--providers", default=",".join(p for p in PROVIDER_ORDER if p not in OPT_IN_PROVIDERS),
                   help=f"subset of {','.join(PROVIDER_ORDER)}")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    p.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure each point this many times, providers in rotated order; report the median")
    p.add_argument("--no-check", action="store_true", help="skip the relative-L2 accuracy check")
    p.add_argument("--out-dir", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing providers")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    args.argv = list(argv)
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmark_attn.py needs a CUDA GPU; torch sees none.")
        return 1
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    wanted = [p.strip() for p in args.providers.split(",") if p.strip()]
    unknown = set(wanted) - set(PROVIDERS)
    if unknown:
        print(f"unknown provider(s) {sorted(unknown)}; choose from {PROVIDER_ORDER}")
        return 2
    env = environment()
    print(f"{env['date']} | {env['gpu']} | torch {env['torch']} CUDA {env['cuda']} cuDNN {env['cudnn']}")

    runs = {}
    for name in wanted:
        try:
            runs[name] = PROVIDERS[name]()
            print(f"provider {name}: ready")
        except ProviderUnavailable as err:
            print(f"provider {name}: unavailable -- {err}")
    providers = [p for p in PROVIDER_ORDER if p in runs]

    grid = [(h, c, s) for h in args.hdims for c in causals for s in args.seqlens]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (hdim, causal, seqlen) in enumerate(grid, 1):
        print(f"[{i}/{len(grid)}] hdim {hdim} causal={causal} seqlen {seqlen} "
              f"(batch {TOKENS // seqlen} x heads {HEADS_X_HDIM // hdim})", flush=True)
        measured = {provider: [] for provider in providers}
        for r, order in enumerate(round_orders(providers, i - 1, args.rounds)):
            for provider in order:
                row = measure_point(provider, runs[provider], dtype, hdim, causal, seqlen, args)
                measured[provider].append(row)
                print(f"    {provider:18s} fwd {_fmt(row.fwd_tflops, 1):>6} TFLOP/s"
                      + (f"   bwd {_fmt(row.bwd_tflops, 1):>6} TFLOP/s" if args.bwd else "")
                      + (f"   (round {r + 1})" if args.rounds > 1 else ""), flush=True)
        rows += [combine_rounds(measured[provider]) for provider in providers]
        write_csv(rows, args.out_dir / "latest.csv")  # so far: a run cut off by a timeout still reports
        torch.cuda.empty_cache()

    errors = {} if args.no_check else accuracy_check(runs, dtype, args.hdims, causals)
    write_csv(rows, args.out_dir / "latest.csv")
    report = markdown(rows, env, args, errors, providers)
    (args.out_dir / "latest.md").write_text(report)
    plotted = plot(rows, args.out_dir / "latest.png", providers, args.bwd, args.dtype)
    print()
    print(report)
    print(f"wrote {args.out_dir / 'latest.csv'}, {args.out_dir / 'latest.md'}"
          + (f", {args.out_dir / 'latest.png'}" if plotted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
