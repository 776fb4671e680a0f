"""Developer tool for the GPU machine: build several variants of one forward kernel side by side
(tile sizes and other compile-time knobs), check each on a few awkward shapes, and time them
against cuDNN in one run. Each variant is its own extension with its own op namespace.
With --bwd the variants also build the backward, and the backward is checked and timed instead.

    python3 tools/gpu/variants.py --hdim 128 --variant base --variant n128:M=128,N=128,S=2 ...
    python3 tools/gpu/variants.py --hdim 128 --variant base --variant t:M=128,N=144,S=2

A variant is NAME[:KEY=VALUE,...] with keys M, N, S (block M, block N, stages; all three or
none) or any other macro (passed as -DKEY=VALUE). Every variant compiles with the package build's
flags (tools/build/build_support.py, $FLASH_ATTN_HOPPER_EXTRA_NVCC_FLAGS included). On the device,
tools/gpu/run.sh's variants step builds several sets side by side and times each under a timeout.
"""
import argparse
import math
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("FLASH_VARIANTS_BUILD", "/tmp/flash_variants"))
sys.path.insert(0, str(ROOT / "tools" / "build"))
import build_support  # noqa: E402  (the package build's flags and CUTLASS lookup)


def parse_variant(text):
    name, _, rest = text.partition(":")
    defines = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        key = {"M": "FLASH_FWD_DEV_BLOCK_M", "N": "FLASH_FWD_DEV_BLOCK_N", "S": "FLASH_FWD_DEV_STAGES"}.get(key, key)
        defines[key] = value
    return name, defines


def write_if_changed(path, text):
    """Rewrite a generated source only when it changes: a new mtime makes ninja rebuild it."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def write_manifest_header():
    """csrc/generated/manifest.h, which flash_api.cpp includes, as setup.py's build writes it."""
    path = next(ROOT.glob("tools/**/generate_instantiations.py"))  # wherever tools/ keeps the generator
    spec = importlib.util.spec_from_file_location("_fah_generate_instantiations", path)
    gen = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(gen)
    out = ROOT / "csrc" / "generated"
    out.mkdir(parents=True, exist_ok=True)
    write_if_changed(out / gen.MANIFEST_HEADER_NAME, gen.render_manifest_header())


def sources(name, hdim, dtype, bwd=False):
    ctype = {"bf16": "cutlass::bfloat16_t", "fp16": "cutlass::half_t"}[dtype]
    write_manifest_header()
    d = BUILD / name
    d.mkdir(parents=True, exist_ok=True)
    api = d / "api.cpp"
    write_if_changed(api,
        f"#define FLASH_ATTN_HOPPER_REGISTRY_PROVIDED\n"
        f"#define FLASH_ATTN_HOPPER_FOR_EACH_FWD(X) X({hdim}, {ctype})\n"
        + (f"#define FLASH_ATTN_HOPPER_FOR_EACH_BWD(X) X({hdim}, {ctype})\n#define FLASH_ATTN_HOPPER_HAS_BWD 1\n"
           if bwd else "")
        + '#include "flash_api.cpp"\n')
    inst = d / "inst.cu"
    write_if_changed(inst,
        f'#include "launch/fwd_launch.cuh"\n'
        f"template void flash::run_flash_fwd<{hdim}, {ctype}>(flash::FwdParams&, cudaStream_t);\n")
    files = [str(api), str(inst), str(ROOT / "csrc" / "launch" / "driver.cu")]  # driver.cu: cuTensorMapEncodeTiled
    if bwd:
        inst_bwd = d / "inst_bwd.cu"
        write_if_changed(inst_bwd,
            f'#include "launch/bwd_launch.cuh"\n'
            f"template void flash::run_flash_bwd<{hdim}, {ctype}>(flash::BwdParams&, cudaStream_t);\n")
        files.append(str(inst_bwd))
    return files


def build(args):
    name, defines, hdim, dtype, bwd = args
    from torch.utils.cpp_extension import load
    cutlass = build_support.find_cutlass(ROOT)
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    ns = f"fahv_{name}"
    # The package build's flags ($FLASH_ATTN_HOPPER_EXTRA_NVCC_FLAGS included), ptxas -v, then the
    # variant's macros; the binding sees the macros too (a block size can size its workspaces).
    macros = [f"-DFLASH_ATTN_HOPPER_OP_NAMESPACE={ns}"] + [f"-D{k}={v}" for k, v in defines.items()]
    nvcc = build_support.nvcc_flags({**os.environ, build_support.ENV_VERBOSE_PTXAS: "1"}) + macros
    cxx = build_support.cxx_flags() + macros
    start = time.time()
    load(name=ns, sources=sources(name, hdim, dtype, bwd), extra_cflags=cxx, extra_cuda_cflags=nvcc,
         extra_include_paths=[str(ROOT / "csrc"), *cutlass.include_dirs, f"{cuda_home}/include/cccl"],
         build_directory=str(BUILD / name), verbose=False)
    return name, time.time() - start


def time_in_rounds(runs, rounds):
    """Median do_bench time of every callable in runs over `rounds` rounds, the order rotated every
    round: a provider timed right after another one measured up to ~3 % slower than the same kernel
    timed first (clocks drop under sustained load)."""
    from triton.testing import do_bench
    order = list(runs)
    times = {name: [] for name in order}
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            times[name].append(do_bench(runs[name], warmup=50, rep=300, return_mode="median"))
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def report(med, flops):
    """' cuDNN x | name y (ratio) ...' in TFLOP/s, ratios against the first entry (cuDNN)."""
    first, t = next(iter(med.items()))
    line = f" {first} {flops / t / 1e9:6.1f}"
    for name, t2 in list(med.items())[1:]:
        line += f" | {name} {flops / t2 / 1e9:6.1f} ({t / t2:.3f})"
    return line


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--seqlens", default="512,2048,8192")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="print each check case before it runs (find a hang)")
    ap.add_argument("--bwd", action="store_true", help="build, check and time the backward")
    ap.add_argument("--deterministic", action="store_true", help="with --bwd: also time deterministic=True")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every provider this many times at each point, in a rotated order, and report "
                         "the medians (same-kernel variants differ by 2-4 %% in one round)")
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    with mp.get_context("spawn").Pool(len(variants)) as pool:
        for name, secs in pool.imap_unordered(build, [(n, d, args.hdim, args.dtype, args.bwd) for n, d in variants]):
            print(f"built {name} in {secs:.0f} s", flush=True)
    if args.build_only:
        return
    if args.bwd:
        return main_bwd(args, variants)

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sys.path.insert(0, str(ROOT / "tools" / "check"))
    from fwd_check import reference
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    ops = {}
    for name, defines in variants:
        build((name, defines, args.hdim, args.dtype, False))  # already built: only loads
        ops[name] = getattr(torch.ops, f"fahv_{name}").fwd

    d = args.hdim
    for name, op in ops.items():  # correctness first: a moving error is a race
        worst = 0.0
        worst_lse = 0.0
        # ramp: keys scaled up towards the start, so a row's max keeps growing (by more than the
        # softmax's rescale slack) as the kernel walks the key blocks from the last one down.
        # spike: the first key (visited last) scaled, so that rows move their max by ~1.4 x spike
        # in the exp2 domain at the last block (100: past exp2's range from the stale max).
        # window: sliding windows, where a row may see nothing in the first key block visited
        # (its max stays -inf into the next block) and the top rows of a tile see nothing at all.
        for (sq, sk, causal, ramp, window, *spike) in [
                (113, 203, False, 0, (-1, -1)), (799, 3, True, 0, (-1, -1)), (1024, 1024, True, 0, (-1, -1)),
                (2048, 2049, False, 0, (-1, -1)), (300, 4000, True, 0, (-1, -1)), (256, 3000, False, 12, (-1, -1)),
                (1000, 1000, True, 12, (-1, -1)), (300, 500, False, 0, (37, 11)), (700, 900, False, 12, (90, 0)),
                (1200, 400, True, 0, (-1, -1)),
                # many short tiles per CTA (564 tiles of 128 rows on 132 SMs): tile hand-overs
                (6000, 300, True, 0, (-1, -1)), (6000, 300, False, 0, (-1, -1)),
                (300, 2500, False, 0, (-1, -1), 8.0), (300, 2500, True, 0, (-1, -1), 100.0),
                (300, 2500, False, 0, (-1, -1), 100.0)]:
            for rep in range(2):
                if args.verbose:
                    print(f"{name}: checking sq={sq} sk={sk} causal={causal} rep={rep}", flush=True)
                q = torch.randn(2, sq, 6, d, device="cuda", dtype=dtype)
                k = torch.randn(2, sk, 2, d, device="cuda", dtype=dtype)
                v = torch.randn(2, sk, 2, d, device="cuda", dtype=dtype)
                if ramp:
                    grow = 1 + ramp * torch.linspace(1, 0, sk, device="cuda")
                    k = (k.float() * grow[None, :, None, None]).to(dtype)
                if spike:
                    k[:, 0] = k[:, 0] * spike[0]
                out, lse = op(q, k, v, d ** -0.5, causal, window[0], window[1])
                if args.verbose:
                    torch.cuda.synchronize()
                o_ref, lse_ref = reference(q, k, v, causal, d ** -0.5, window=window)
                o_low, _ = reference(q, k, v, causal, d ** -0.5, dtype=dtype, window=window)
                err = (out.float() - o_ref).abs().max().item()
                bound = 2 * (o_low.float() - o_ref).abs().max().item() + 1e-3
                worst = max(worst, err / bound)
                lse_ref = lse_ref.transpose(1, 2) if lse_ref.shape != lse.shape else lse_ref
                fin = torch.isfinite(lse_ref)
                worst_lse = max(worst_lse, (lse.float()[fin] - lse_ref[fin]).abs().max().item() if fin.any() else 0.0)
        print(f"{name}: worst error / bound = {worst:.2f}, lse max error {worst_lse:.1e} "
              f"{'ok' if worst <= 1 and worst_lse < 1e-2 else 'FAIL'}", flush=True)

    h = 2048 // d
    rows = []
    for causal in [bool(int(c)) for c in args.causal.split(",")]:
        for s in [int(x) for x in args.seqlens.split(",")]:
            b = 16384 // s
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3))
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            runs = {"cuDNN": cudnn}
            runs.update({name: (lambda op=op: op(q, k, v, d ** -0.5, causal)) for name, op in ops.items()})
            print(f"causal={int(causal)} seqlen={s:5d}" + report(time_in_rounds(runs, args.rounds), flops), flush=True)


def main_bwd(args, variants):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sys.path.insert(0, str(ROOT / "tools" / "check"))
    from bwd_check import check
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    ops = {}
    for name, defines in variants:
        build((name, defines, args.hdim, args.dtype, True))  # already built: only loads
        ops[name] = getattr(torch.ops, f"fahv_{name}")
    d = args.hdim
    cases = [dict(b=2, sq=113, sk=203, hq=6, hk=2, causal=False), dict(b=2, sq=799, sk=3, hq=6, hk=2, causal=True),
             dict(b=2, sq=1024, sk=1024, hq=6, hk=2, causal=True), dict(b=1, sq=2048, sk=2049, hq=4, hk=4, causal=False),
             dict(b=2, sq=300, sk=500, hq=4, hk=2, causal=False, window=(37, 11)),
             dict(b=2, sq=500, sk=300, hq=4, hk=2, causal=True, top_left=True),
             # more key-block tiles than the H200 has SMs (132), so that CTA scheduling across
             # heads (persistent or reordered grids) is checked too
             dict(b=4, sq=1000, sk=1500, hq=8, hk=4, causal=False), dict(b=4, sq=1500, sk=1200, hq=8, hk=4, causal=True)]
    for name, op in ops.items():  # correctness first, twice: a moving error is a race
        for det in ([False, True] if args.deterministic else [False]):
            ok = True
            for _ in range(2):
                for case in cases:
                    ok &= check(d=d, dtype=dtype, op=op, deterministic=det, **case)
            print(f"{name}{'-det' if det else ''}: backward {'ok' if ok else 'FAIL'}", flush=True)

    h = 2048 // d
    for causal in [bool(int(c)) for c in args.causal.split(",")]:
        for s in [int(x) for x in args.seqlens.split(",")]:
            b = 16384 // s
            q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(4))
            flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
            qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            g = dout.transpose(1, 2)
            runs = {"cuDNN": lambda: torch.autograd.grad(o, (qt, kt, vt), g, retain_graph=True)}
            for name, op in ops.items():
                out, lse = op.fwd(q, k, v, d ** -0.5, causal)
                for det in ([False, True] if args.deterministic else [False]):
                    runs[f"{name}{'-det' if det else ''}"] = (
                        lambda op=op, out=out, lse=lse, det=det:
                        op.bwd(dout, q, k, v, out, lse, d ** -0.5, causal, -1, -1, False, det))
            print(f"bwd causal={int(causal)} seqlen={s:5d}" + report(time_in_rounds(runs, args.rounds), flops),
                  flush=True)


if __name__ == "__main__":
    main()
