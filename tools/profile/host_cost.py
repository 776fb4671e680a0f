"""The host's time per attention call, layer by layer, for ours and FlashAttention-3.

A benchmark's timer starts while the host still prepares the call (triton's do_bench clears the
L2 with a ~80 us memset first), so host time beyond that is timed as kernel time (decision 073).
On a tiny problem (the GPU waits for the host, the queue never fills) this times N calls of:

  ours / fa3        the public function (flash_attn_func, flash_attn_varlen_func)
  ours-op           our op through the dispatcher (its Python autograd kernel included)
  ours-op-noautograd  the op below autograd: the C++ binding, allocations and launches alone
  +bwd              a forward and torch.autograd.grad per step, minus the forward (the backward's host time)

    python tools/profile/host_cost.py [--calls 400] [--only ours-op-noautograd --loop 20000]
    python tools/profile/host_cost.py --cprofile ours   # the Python frames of one layer

--loop N runs one layer N times and nothing else (for `perf record`).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

import torch

HEADS, HDIM, SEQLEN = 16, 128, 128


def _inputs(grad: bool):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(SEQLEN, HEADS, HDIM, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    if grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    cu = torch.tensor([0, SEQLEN], dtype=torch.int32, device="cuda")
    return q, k, v, cu


def _public(lib, causal: bool) -> tuple:
    """The makers of lib's flash_attn_func (on the packed rows as one batch entry) and flash_attn_varlen_func."""
    def dense(grad):
        q, k, v, _ = _inputs(grad)
        q4, k4, v4 = (t.unsqueeze(0) for t in (q, k, v))
        return (lambda: lib.flash_attn_func(q4, k4, v4, causal=causal)), (q, k, v)

    def varlen(grad):
        q, k, v, cu = _inputs(grad)
        return (lambda: lib.flash_attn_varlen_func(q, k, v, cu, cu, SEQLEN, SEQLEN, causal=causal)), (q, k, v)

    return dense, varlen


def layers(causal: bool) -> dict:
    """name -> make(grad) -> (call, its q, k, v) for every layer importable here."""
    import flash_attn_hopper as ours

    def ours_op(grad, below_autograd=False):
        q, k, v, cu = _inputs(grad)
        op = torch.ops.flash_attn_hopper.varlen_fwd.default
        scale = HDIM ** -0.5
        right = 0 if causal else -1
        call = lambda: op(q, k, v, cu, cu, None, None, SEQLEN, SEQLEN, scale, causal, -1, right)[0]
        if not below_autograd:
            return call, (q, k, v)

        def below():
            with torch._C._AutoDispatchBelowAutograd():
                return call()
        return below, (q, k, v)

    found = dict(zip(("ours-dense", "ours"), _public(ours, causal)))
    found.update({"ours-op": ours_op, "ours-op-noautograd": lambda grad: ours_op(False, below_autograd=True)})
    try:
        import flash_attn_interface as fa3
    except ImportError:
        return found
    found.update(zip(("fa3-dense", "fa3"), _public(fa3, causal)))
    return found


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def host_us(fn, calls: int) -> float:
    """Host microseconds per call of fn over `calls` calls (best of 3 batches), the GPU drained between."""
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def step_with_backward(call, inputs):
    dout = torch.ones_like(_first(call()))

    def step():
        torch.autograd.grad(_first(call()), inputs, dout)
    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--only", action="append", help="these layers (repeatable); default all")
    p.add_argument("--loop", type=int, default=0, help="run the --only layer this many times, nothing else")
    p.add_argument("--cprofile", help="cProfile this layer's forward (top frames by own time)")
    args = p.parse_args()
    found = layers(args.causal)
    if args.cprofile:
        fn, _ = found[args.cprofile](False)
        with torch.no_grad():
            host_us(fn, 50)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.calls):
                fn()
            prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    names = args.only or list(found)
    if args.loop:
        fn, _ = found[names[0]](False)
        with torch.no_grad():
            for _ in range(args.loop):
                fn()
        torch.cuda.synchronize()
        return
    print(f"# host us per call, {SEQLEN} tokens x {HEADS} heads x {HDIM}, bf16, causal {args.causal}, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("layer,fwd_no_grad_us,fwd_grad_us,bwd_us")
    for name in names:
        with torch.no_grad():
            fwd = host_us(found[name](False)[0], args.calls)
        bwd = fwd_grad = float("nan")
        if "noautograd" not in name:
            call, inputs = found[name](True)
            fwd_grad = host_us(call, args.calls)
            bwd = host_us(step_with_backward(call, inputs), args.calls) - fwd_grad
        print(f"{name},{fwd:.1f},{fwd_grad:.1f},{bwd:.1f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
