"""The one factory of test inputs, and the NaN poisoning of the memory an op's outputs land in.

``qkv`` draws q (b, sq, hq, d), k and v (b, sk, hk, d) -- GQA when hq != hk, v's head dim
``dv`` if given -- and, with ``dout=True``, dout (b, sq, hq, dv): from one seeded generator on
``device``, in that order (or one generator per tensor, seeded seed, seed + 1, ...), in
``dtype`` (or drawn in ``draw_dtype`` and rounded to ``dtype``).  ``heads_first`` returns them
as (batch, heads, seqlen, head_dim), SDPA's order; ``layout`` picks the memory behind them:

- ``"contiguous"``: contiguous in the returned order;
- ``"bshd_memory"``: (b, s, h, d) memory (models' q.view(b, s, h, d).transpose(1, 2) when heads_first);
- ``"bhsd_memory"`` (also spelt ``"bhsd_contiguous"``, ``"bhsd_transposed"``): (b, h, s, d) memory;
- ``"every_other_head"``: every other head of (b, s, 2h, d);
- ``"batch_stride_gap"``: (b + 1, s + 5, h, d) memory without its first batch entry and first 5 rows;
- ``"packed"``: q, k, v split along the heads of one (b, s, hq + 2 hk, d) tensor (sq == sk), dout on its own.

Every layout keeps a unit stride in the last dimension.
"""

from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "bshd_memory", "bhsd_memory", "every_other_head", "batch_stride_gap", "packed")
_ALIASES = {"bhsd_contiguous": "bhsd_memory", "bhsd_transposed": "bhsd_memory"}


def _randn(shape, generator, dtype, draw_dtype, device) -> torch.Tensor:
    if draw_dtype is None or draw_dtype == dtype:
        return torch.randn(*shape, generator=generator, dtype=dtype, device=device)
    return torch.randn(*shape, generator=generator, dtype=draw_dtype, device=device).to(dtype)


def _bshd(draw, b, s, h, e, layout, heads_first) -> torch.Tensor:
    """A (b, s, h, e) tensor -- (b, h, s, e) when heads_first -- over the memory ``layout`` names."""
    if layout == "contiguous":
        return draw((b, h, s, e) if heads_first else (b, s, h, e))
    if layout == "bhsd_memory":
        t = draw((b, h, s, e))
        return t if heads_first else t.transpose(1, 2)
    if layout == "bshd_memory":
        t = draw((b, s, h, e))
    elif layout == "every_other_head":
        t = draw((b, s, 2 * h, e))[:, :, ::2]
    elif layout == "batch_stride_gap":
        t = draw((b + 1, s + 5, h, e))[1:, 5:]
    else:
        raise ValueError(f"unknown layout {layout!r}; one of {LAYOUTS}")
    return t.transpose(1, 2) if heads_first else t


def qkv(
    b: int,
    sq: int,
    sk: int,
    hq: int,
    hk: int,
    d: int,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cuda",
    seed: int | None = 0,
    layout: str = "contiguous",
    heads_first: bool = False,
    dout: bool = False,
    dv: int | None = None,
    draw_dtype: torch.dtype | None = None,
    seed_per_tensor: bool = False,
    requires_grad: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Random (q, k, v), or (q, k, v, dout) with ``dout=True``; see the module's docstring.

    ``seed=None`` draws from torch's global generator (fake tensors, values that do not
    matter); ``requires_grad`` makes q, k and v leaves that require grad.
    """
    layout = _ALIASES.get(layout, layout)
    dv = d if dv is None else dv
    shared = None if seed is None or seed_per_tensor else torch.Generator(device=device).manual_seed(seed)
    index = iter(range(4))

    def draw(shape):
        i = next(index)
        gen = shared
        if seed is not None and seed_per_tensor:
            gen = torch.Generator(device=device).manual_seed(seed + i)
        return _randn(shape, gen, dtype, draw_dtype, device)

    if layout == "packed":
        if sq != sk or dv != d:
            raise ValueError("the packed layout needs seqlen_q == seqlen_k and one head dim")
        packed = draw((b, sq, hq + 2 * hk, d))
        tensors = list(packed.split([hq, hk, hk], dim=2))
        if heads_first:
            tensors = [t.transpose(1, 2) for t in tensors]
        if dout:
            tensors.append(_bshd(draw, b, sq, hq, dv, "bshd_memory", heads_first))
    else:
        tensors = [
            _bshd(draw, b, sq, hq, d, layout, heads_first),
            _bshd(draw, b, sk, hk, d, layout, heads_first),
            _bshd(draw, b, sk, hk, dv, layout, heads_first),
        ]
        if dout:
            tensors.append(_bshd(draw, b, sq, hq, dv, layout, heads_first))
    if requires_grad:
        tensors[:3] = [t.detach().requires_grad_() for t in tensors[:3]]
    return tuple(tensors)


def poison_allocations(*specs) -> list[int]:
    """Fill the blocks an op's next allocations will get with NaN; return their addresses.

    ``specs`` are (shape, dtype) of what the op allocates itself (outputs, gradients), so
    we cannot hand it a poisoned buffer. Instead: empty torch's cache, allocate NaN
    tensors of those sizes and free them; the caching allocator gives those cached
    blocks to the next allocations of the same sizes, so rows a kernel forgets to
    write stay NaN.
    """
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    blocks = [torch.full(shape, float("nan"), dtype=dtype, device="cuda") for shape, dtype in specs]
    addresses = [t.data_ptr() for t in blocks]
    del blocks
    return addresses


def sdpa_inputs(b, hq, hk, sq, sk, e, dtype, seed=0, layout="bshd_memory", requires_grad=False):
    """q, k, v in SDPA's (batch, heads, seqlen, head_dim) order on the GPU, arguments in that order too;
    by default transposed views of (batch, seqlen, heads, head_dim) memory, as models make them.
    One generator per tensor (seed, seed + 1, seed + 2)."""
    return qkv(
        b, sq, sk, hq, hk, e, dtype=dtype, seed=seed, layout=layout, heads_first=True, seed_per_tensor=True,
        requires_grad=requires_grad,
    )


def cpu_inputs(b, sq, sk, hq, hk, d, seed=0, dtype=torch.float16):
    """CPU q, k, v, dout in (batch, seqlen, heads, head_dim), drawn in float32 from one seeded generator
    and rounded to ``dtype`` (fp16 by default: the CPU tests' emulations compute in float32, and fp16
    keeps their comparisons sharp)."""
    return qkv(b, sq, sk, hq, hk, d, dtype=dtype, device="cpu", seed=seed, dout=True, draw_dtype=torch.float32)


#: Memory layouts of packed (total, heads, head_dim) tensors, each with a unit last stride.
VARLEN_LAYOUTS = ("contiguous", "every_other_head", "row_gap", "packed")


def _cu(lengths, device) -> torch.Tensor:
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + int(n))
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def varlen_qkv(
    lens_q,
    lens_k=None,
    hq: int = 4,
    hk: int = 2,
    d: int = 64,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cuda",
    seed: int = 0,
    layout: str = "contiguous",
    draw_dtype: torch.dtype | None = None,
):
    """A packed batch: q (total_q, hq, d), k and v (total_k, hk, d), dout like q, cu_seqlens_q and
    cu_seqlens_k (int32 on ``device``), max_seqlen_q and max_seqlen_k (ints).

    Sequence b has lens_q[b] queries and lens_k[b] keys (lens_k defaults to lens_q).  ``layout``:
    ``"contiguous"``; ``"every_other_head"`` (every other head of (total, 2h, d)); ``"row_gap"``
    (rows of (total, h, d + 16) memory cut to d: row stride beyond h * d); ``"packed"`` (q, k, v split
    along the heads of one (total, hq + 2 hk, d) tensor; needs lens_q == lens_k).  One seeded generator.
    """
    lens_k = list(lens_q) if lens_k is None else list(lens_k)
    lens_q = list(lens_q)
    if len(lens_q) != len(lens_k):
        raise ValueError("lens_q and lens_k need one entry per sequence")
    total_q, total_k = sum(lens_q), sum(lens_k)
    gen = torch.Generator(device=device).manual_seed(seed)

    def draw(shape):
        return _randn(shape, gen, dtype, draw_dtype, device)

    def packed(total, h):
        if layout == "contiguous":
            return draw((total, h, d))
        if layout == "every_other_head":
            return draw((total, 2 * h, d))[:, ::2]
        if layout == "row_gap":
            return draw((total, h, d + 16))[:, :, :d]
        raise ValueError(f"unknown layout {layout!r}; one of {VARLEN_LAYOUTS}")

    if layout == "packed":
        if lens_q != lens_k:
            raise ValueError("the packed layout needs lens_q == lens_k")
        q, k, v = draw((total_q, hq + 2 * hk, d)).split([hq, hk, hk], dim=1)
        dout = draw((total_q, hq, d))
    else:
        q, k, v, dout = packed(total_q, hq), packed(total_k, hk), packed(total_k, hk), packed(total_q, hq)
    return (
        q, k, v, dout, _cu(lens_q, device), _cu(lens_k, device),
        max(lens_q, default=0), max(lens_k, default=0),
    )
