"""Context parallelism over flash_attn_hopper's kernels: torch's ring attention
(``torch.distributed.tensor.experimental.context_parallel``) shards the sequence across the
ranks, passes K/V blocks around a ring over NCCL and merges the blocks' partial outputs with their
log-sum-exp; each block is one ``aten::_scaled_dot_product_flash_attention`` call (and its
backward), which ``activate_flash_attention_impl("flash_attn_hopper")`` serves with our kernels.
No communication code of ours.

    torchrun --nproc-per-node 2 examples/context_parallel.py --check               # correctness
    torchrun --nproc-per-node 2 examples/context_parallel.py --bench --seqlen 131072

--check: one attention layer (bf16, GQA, hdim 128) forward and backward under CP, causal with
torch's head-tail load balancing and non-causal, against the same layer on one GPU without CP
(our kernels) and a float32 reference, by FlashAttention's rule: |CP - ref| <= 2 |one GPU - ref|
+ rounding noise, for the output and every weight's gradient. --bench: the layer's forward +
backward step under CP for each of --backends (ours; torch's cudnn and FlashAttention-2 kernels),
and on one GPU without CP (ours): CUDA events over a fixed count of steps, the slowest rank, the
median of --rounds with the backends rotated.
Runs with one rank too (the same code path, a ring of one).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import _cp_options, context_parallel_unshard  # torch 2.11-2.14
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = ("ours", "cudnn", "flash2")


class Attention(nn.Module):
    """q / kv projections, SDPA with grouped-query heads, the output projection."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int, causal: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.causal = heads, kv_heads, head_dim, causal
        dim = heads * head_dim
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wkv = nn.Linear(dim, 2 * kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, seqlen, heads * head_dim)
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.wkv(x).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # (batch, heads, seqlen, head_dim): CP's sequence dim is 2
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=self.heads != self.kv_heads)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


@contextlib.contextmanager
def attention_backend(name: str):
    """SDPA's backend for a block: our kernels through torch's registry, or torch's own."""
    if name == "ours":
        import flash_attn_hopper  # noqa: F401  (registers "flash_attn_hopper")
        from torch.nn.attention import activate_flash_attention_impl, restore_flash_attention_impl

        activate_flash_attention_impl("flash_attn_hopper")
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                yield
        finally:
            restore_flash_attention_impl()
    else:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION if name == "cudnn" else SDPBackend.FLASH_ATTENTION):
            yield


def step(layer: nn.Module, x: torch.Tensor, dout: torch.Tensor) -> torch.Tensor:
    layer.zero_grad(set_to_none=True)
    y = layer(x)
    y.backward(dout)
    return y


def cp_step(mesh, layer, x, dout, causal: bool, gather: bool = True) -> torch.Tensor | None:
    """One step under CP: copies of x and dout sharded along the sequence (head-tail order when
    causal: torch balances causal rings only). gather: the weights' gradients summed over the
    ranks and the output gathered back into sequence order (what the check compares)."""
    _cp_options.enable_load_balance = causal
    x_, dout_ = x.clone(), dout.clone()
    with context_parallel(mesh, buffers=[x_, dout_], buffer_seq_dims=[1, 1], no_restore_buffers={x_, dout_}):
        y = step(layer, x_, dout_)
    if not gather:
        return None
    for p in layer.parameters():
        dist.all_reduce(p.grad)
    return context_parallel_unshard(mesh, [y.detach()], [1])[0]


def check(mesh, args, seqlen: int) -> bool:
    torch.manual_seed(0)  # every rank the same inputs and weights
    ok = True
    for causal in (True, False):
        layer = Attention(args.heads, args.kv_heads, args.head_dim, causal).cuda()
        x = torch.randn(1, seqlen, args.heads * args.head_dim, device="cuda")
        dout = torch.randn_like(x)
        ref_y = step(layer, x, dout)  # float32, torch's maths
        ref = [ref_y.detach()] + [p.grad.clone() for p in layer.parameters()]
        layer.bfloat16()
        xb, doutb = x.bfloat16(), dout.bfloat16()
        with attention_backend("ours"):
            one = [step(layer, xb, doutb).detach()] + [p.grad.clone() for p in layer.parameters()]
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                cp = [cp_step(mesh, layer, xb, doutb, causal)] + [p.grad.clone() for p in layer.parameters()]
                torch.cuda.synchronize()
        # The ring's blocks ran our kernels (namespace flash), not torch's FlashAttention-2 (pytorch_flash).
        names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
        ours = {k: any(k in n and "pytorch_flash" not in n for n in names) for k in ("flash_fwd_kernel", "flash_bwd_kernel")}
        torch2 = any("pytorch_flash" in n for n in names)
        ok &= all(ours.values()) and not torch2
        if dist.get_rank() == 0:
            print(f"causal={causal}: our kernels ran {ours}, torch's FlashAttention-2 ran: {torch2}")
        for name, r, o, c in zip(("out", "dwq", "dwkv", "dwo"), ref, one, cp):
            err_one, err_cp = (o.float() - r).abs().max().item(), (c.float() - r).abs().max().item()
            bound = 2 * err_one + r.abs().max().item() * 2 ** -8  # FlashAttention's rule, bf16 rounding noise
            good = err_cp <= bound
            ok &= good
            if dist.get_rank() == 0:
                print(f"causal={causal} {name}: |cp - ref| {err_cp:.3e}, |one GPU - ref| {err_one:.3e}, "
                      f"bound {bound:.3e} {'ok' if good else 'FAIL'}")
    return ok


def time_ms(fn, iters: int) -> float:
    """Milliseconds per call over a fixed count of calls (every rank the same count: the ring's
    collectives would hang if ranks ran different counts, as do_bench's own estimate could), the
    slowest rank's."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    ms = torch.tensor([start.elapsed_time(end) / iters], device="cuda")
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    return ms.item()


def bench(mesh, args, seqlen: int) -> None:
    world = dist.get_world_size()
    layer = Attention(args.heads, args.kv_heads, args.head_dim, args.causal).cuda().bfloat16()
    x = torch.randn(1, seqlen, args.heads * args.head_dim, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn_like(x)
    runs = {f"cp{world}-{b}": (b, True) for b in args.backends.split(",")} | {"one-gpu-ours": ("ours", False)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(args.rounds):
        for name in list(runs)[r % len(runs):] + list(runs)[:r % len(runs)]:  # rotated
            backend, distributed = runs[name]
            with attention_backend(backend):
                if distributed:
                    fn = lambda: cp_step(mesh, layer, x, dout, args.causal, gather=False)  # noqa: E731
                else:
                    fn = lambda: step(layer, x, dout)  # noqa: E731
                times[name].append(time_ms(fn, args.iters))
    if dist.get_rank() == 0:
        one = statistics.median(times["one-gpu-ours"])
        print(f"seqlen {seqlen}, heads {args.heads}/{args.kv_heads} x {args.head_dim}, causal={args.causal}, "
              f"{world} rank(s), {torch.cuda.get_device_name()}, torch {torch.__version__}; "
              f"median of {args.rounds} rounds x {args.iters} steps, the slowest rank")
        for name, ts in times.items():
            ms = statistics.median(ts)
            print(f"{name:16s} {ms:9.2f} ms/step  {seqlen / ms * 1e3:12.0f} tokens/s  {one / ms:5.2f}x one GPU")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true")
    p.add_argument("--bench", action="store_true")
    p.add_argument("--seqlen", type=int, default=None, help="tokens (default: 8192 for --check, 131072 for --bench)")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True, help="--bench's mask")
    p.add_argument("--backends", default=",".join(BACKENDS), help="--bench: CP over these (ours, cudnn, flash2)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=5, help="--bench: timed steps per round")
    args = p.parse_args()
    if not (args.check or args.bench):
        p.error("pass --check and/or --bench")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    mesh = init_device_mesh("cuda", (world,))
    ok = check(mesh, args, args.seqlen or 8192) if args.check else True
    if args.bench:
        bench(mesh, args, args.seqlen or 131072)
    if args.check and dist.get_rank() == 0:
        print("context parallel check: " + ("all ok" if ok else "FAILED"))
    dist.destroy_process_group()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
