"""``python -m flash_attn_hopper``: print the build, check it against a float32
reference on a few shapes, and time it against torch's cuDNN SDPA.

On a machine that cannot run the kernels it prints the build and why, and
exits 0.  Exits 1 when a self-check fails.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys

import torch

import flash_attn_hopper
from flash_attn_hopper import manifest


def _yes(flag) -> str:
    return "yes" if flag else "no"


def print_build_info(info: dict) -> None:
    print(f"flash_attn_hopper {info['version']}")
    if info["extension_loaded"]:
        print("  extension:  loaded")
    else:
        print(f"  extension:  not loaded -- {info['load_error']}")
    if info["build_config_found"]:
        compiled = ", ".join(f"{c['direction']} hdim{c['hdim']} {c['dtype']}" for c in info["compiled"]) or "nothing"
        print(f"  compiled:   {compiled}")
        print(
            f"  built:      {info['built_at']} in {info['build_seconds']} s (MAX_JOBS={info['max_jobs']}) with "
            f"torch {info['torch_version']}, CUDA {info['torch_cuda_version']}, nvcc {info['nvcc_version']}, "
            f"CUTLASS {info['cutlass_version']} ({info['cutlass_origin']})"
        )
        slowest = sorted(info.get("compile_seconds", {}).items(), key=lambda kv: -kv[1])[:3]
        if slowest:
            print("  slowest:    " + ", ".join(f"{name} {sec:.0f} s" for name, sec in slowest))
    else:
        print("  compiled:   unknown (no build record: flash_attn_hopper/_build_config.py is absent)")
    print(f"  runtime:    torch {info['runtime_torch_version']}, CUDA {info['runtime_torch_cuda_version']}")
    print(f"  torch:      {torch_range_summary(info)}")
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(index)
            print(f"  device {index}:   {torch.cuda.get_device_name(index)} (sm_{major}{minor})")
    features = ", ".join(f"{name} {_yes(on)}" for name, on in info["features"].items())
    print(f"  features:   {features}")
    print(f"  backward:   {backward_summary(info)}")


def torch_range_summary(info: dict) -> str:
    """One line: the torch versions this build runs under, and whether the running torch is one."""
    sources = f"the sources build against torch >= {info['torch_min_version']}"
    requirement = info.get("torch_requirement")
    if not requirement:
        return f"{sources}; this build recorded no torch range"
    verdict = {True: "ok", False: "NOT MET: rebuild against this torch, or install the torch it was built for",
               None: "unknown"}[info.get("torch_requirement_met")]
    abi = f" (torch's {info['torch_abi']})" if info.get("torch_abi") else ""
    return (f"this build runs under torch {requirement}{abi} (built against {info.get('torch_version')}; "
            f"torch {info['runtime_torch_version']} here: {verdict}); {sources}")


def backward_summary(info: dict) -> str:
    """One line: whether this build computes gradients, with which kernels, and how to get them."""
    compiled = [c for c in info.get("compiled", []) if c["direction"] == "bwd"]
    kernels = ", ".join(f"hdim{c['hdim']} {c['dtype']}" for c in compiled)
    if info["features"]["backward"]:
        return f"yes{' (' + kernels + ')' if kernels else ''}"
    if compiled or info["has_backward_op"]:
        return (f"broken build: the record lists backward kernels [{kernels or 'none'}] but the extension "
                f"{'defines' if info['has_backward_op'] else 'has no'} bwd op; rebuild")
    if "bwd" in manifest.AVAILABLE_DIRECTIONS and (info["extension_loaded"] or info.get("build_config_found")):
        return f"not built (rebuild without {manifest.ENV_DISABLE_BACKWARD}=1)"
    return "not built"


def _torch_attention(q, k, v, scale: float, causal: bool, dtype: torch.dtype):
    """softmax(q kᵀ scale) v with plain torch ops in ``dtype``; (out, lse). Independent of the kernels."""
    q, k, v = (t.to(dtype).transpose(1, 2) for t in (q, k, v))  # (b, h, s, d)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q * scale) @ k.transpose(-1, -2)
    sq, sk = scores.shape[-2:]
    if causal:
        keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores.float(), dim=-1)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0).to(v.dtype)  # rows that see nothing: 0
    return (probs @ v).transpose(1, 2), lse


def self_check(compiled: list[tuple[int, str]]) -> bool:
    shapes = [  # (batch, seqlen_q, seqlen_k, nheads_q, nheads_kv)
        (2, 113, 203, 6, 2),
        (1, 1024, 1024, 8, 8),
        (3, 799, 3, 4, 1),
    ]
    cases = [(hdim, dtype, shape, causal) for hdim, dtype in compiled for shape in shapes for causal in (False, True)]
    print(f"\nSelf-check: {len(cases)} cases against a float32 reference (FlashAttention's rule: "
          "error <= 2 x torch's own low-precision error + rounding noise)")
    all_ok = True
    for i, (hdim, dtype_name, (b, sq, sk, hq, hk), causal) in enumerate(cases, 1):
        dtype = getattr(torch, manifest.DTYPES[dtype_name].torch_name)
        gen = torch.Generator(device="cuda").manual_seed(i)
        q = torch.randn(b, sq, hq, hdim, device="cuda", dtype=dtype, generator=gen)
        k = torch.randn(b, sk, hk, hdim, device="cuda", dtype=dtype, generator=gen)
        v = torch.randn(b, sk, hk, hdim, device="cuda", dtype=dtype, generator=gen)
        scale = hdim**-0.5
        label = f"[{i:2d}/{len(cases)}] hdim {hdim} {dtype_name} causal={causal!s:5} b={b} sq={sq} sk={sk} h={hq}/{hk}"
        try:
            out, lse = flash_attn_hopper.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
            torch.cuda.synchronize()
        except Exception as err:  # report and go on: the summary says which failed
            print(f"{label}: FAILED with {type(err).__name__}: {err}")
            all_ok = False
            continue
        ref, lse_ref = _torch_attention(q, k, v, scale, causal, torch.float32)
        low, _ = _torch_attention(q, k, v, scale, causal, dtype)
        err = (out.float() - ref).abs().max().item()
        torch_err = (low.float() - ref).abs().max().item()
        noise = 2 * (ref.to(dtype) + 0.3 - 0.3 - ref.to(dtype)).abs().max().item()
        finite = torch.isfinite(lse_ref)
        lse_ok = torch.equal(torch.isfinite(lse), finite) and (
            not finite.any() or (lse - lse_ref)[finite].abs().max().item() <= 1e-2
        )
        ok = math.isfinite(err) and err <= 2 * torch_err + noise and lse_ok
        all_ok &= ok
        print(f"{label}: max err {err:.2e} (torch {dtype_name}: {torch_err:.2e}) lse {'ok' if lse_ok else 'WRONG'}"
              f" -> {'ok' if ok else 'FAILED'}", flush=True)
    return all_ok


def self_check_backward(compiled: list[tuple[int, str]], device: str = "cuda") -> bool:
    """dq, dk, dv against autograd through the float32 reference, by the same rule as the forward.

    (``device`` is for the CPU tests, which run it on emulated kernels.)
    """
    shapes = [(2, 113, 203, 6, 2), (1, 256, 256, 4, 4), (2, 300, 77, 4, 1)]
    cases = [(hdim, dtype, shape, causal) for hdim, dtype in compiled for shape in shapes for causal in (False, True)]
    print(f"\nBackward self-check: {len(cases)} cases, dq/dk/dv against autograd through the float32 reference")
    all_ok = True
    for i, (hdim, dtype_name, (b, sq, sk, hq, hk), causal) in enumerate(cases, 1):
        dtype = getattr(torch, manifest.DTYPES[dtype_name].torch_name)
        gen = torch.Generator(device=device).manual_seed(100 + i)
        q, k, v = (
            torch.randn(b, s, h, hdim, device=device, dtype=dtype, generator=gen).requires_grad_()
            for s, h in ((sq, hq), (sk, hk), (sk, hk))
        )
        dout = torch.randn(b, sq, hq, hdim, device=device, dtype=dtype, generator=gen)
        scale = hdim**-0.5
        label = f"[{i:2d}/{len(cases)}] hdim {hdim} {dtype_name} causal={causal!s:5} b={b} sq={sq} sk={sk} h={hq}/{hk}"
        try:
            out = flash_attn_hopper.flash_attn_func(q, k, v, causal=causal)
            grads = torch.autograd.grad(out, (q, k, v), dout)
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as err:  # report and go on: the summary says which failed
            print(f"{label}: FAILED with {type(err).__name__}: {err}")
            all_ok = False
            continue
        leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]  # float32 gradients, unrounded
        ref = torch.autograd.grad(_torch_attention(*leaves, scale, causal, torch.float32)[0], leaves, dout.float())
        low = torch.autograd.grad(_torch_attention(q, k, v, scale, causal, dtype)[0], (q, k, v), dout)
        ok, parts = True, []
        for name, g, r, lo in zip(("dq", "dk", "dv"), grads, ref, low):
            err = (g.float() - r).abs().max().item()
            torch_err = (lo.float() - r).abs().max().item()
            noise = 2 * (r.to(dtype) + 0.3 - 0.3 - r.to(dtype)).abs().max().item()
            ok &= math.isfinite(err) and err <= 2 * torch_err + noise
            parts.append(f"{name} {err:.1e} (torch {torch_err:.1e})")
        all_ok &= ok
        print(f"{label}: {', '.join(parts)} -> {'ok' if ok else 'FAILED'}", flush=True)
    return all_ok


def _time_ms(fn) -> float:
    try:
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    except ImportError:
        pass
    for _ in range(5):
        fn()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def benchmark(compiled: list[tuple[int, str]]) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    points = [(hdim, dtype, s, causal) for hdim, dtype in compiled for s in (1024, 4096) for causal in (False, True)]
    print(f"\nBenchmark: {len(points)} points, forward TFLOP/s, 16k tokens, nheads x hdim = 2048 "
          "(see benchmarks/benchmark_attn.py for the full method)")
    for i, (hdim, dtype_name, seqlen, causal) in enumerate(points, 1):
        dtype = getattr(torch, manifest.DTYPES[dtype_name].torch_name)
        batch, nheads = 16384 // seqlen, max(1, 2048 // hdim)
        q, k, v = (torch.randn(batch, seqlen, nheads, hdim, device="cuda", dtype=dtype) for _ in range(3))
        flops = 4 * batch * nheads * seqlen * seqlen * hdim / (2 if causal else 1)
        ours = _time_ms(lambda: flash_attn_hopper.flash_attn_func(q, k, v, causal=causal))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                peer = _time_ms(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
            peer_text = f"cuDNN SDPA {flops / peer / 1e9:6.1f} TFLOP/s, ours/cuDNN {peer / ours:.2f}x"
        except RuntimeError as err:
            peer_text = f"cuDNN SDPA unavailable ({str(err).splitlines()[0][:80]})"
        print(f"[{i}/{len(points)}] hdim {hdim} {dtype_name} causal={causal!s:5} seqlen {seqlen:5d}: "
              f"flash_attn_hopper {flops / ours / 1e9:6.1f} TFLOP/s, {peer_text}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flash_attn_hopper", description=__doc__.splitlines()[0])
    parser.add_argument("--no-bench", action="store_true", help="skip the benchmark")
    args = parser.parse_args(argv)

    info = flash_attn_hopper.build_info()
    print_build_info(info)
    if not info["available"]:
        print(f"\nflash_attn_hopper cannot run here: {info['unavailable_reason']}.")
        print("Nothing to check on this machine; the build information above is all there is.")
        return 0
    if info["build_config_found"]:
        compiled = [(c["hdim"], c["dtype"]) for c in info["compiled"] if c["direction"] == "fwd"]
    else:
        compiled = [(128, "bf16")]
        print("\nNo build record: checking hdim 128 bf16 only.")
    ok = self_check(compiled)
    if info["features"]["backward"]:
        if info["build_config_found"]:
            compiled_bwd = [(c["hdim"], c["dtype"]) for c in info["compiled"] if c["direction"] == "bwd"]
        else:
            compiled_bwd = compiled
        ok &= self_check_backward(compiled_bwd)
    if not args.no_bench:
        benchmark([(h, d) for h, d in compiled if d == "bf16"] or compiled)
    print(f"\nSelf-check {'passed' if ok else 'FAILED'}.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
