"""The float32 oracle every kernel test compares against, and FlashAttention's tolerance rule.

``attention_ref`` computes attention with plain torch ops in
(batch, seqlen, nheads, headdim) layout: bottom-right aligned causal and
local-window masks, softcap, grouped-query attention.  With ``upcast=True``
(the reference) it computes in float32; with ``upcast=False`` it does the
same maths in the inputs' dtype, which is what "PyTorch's own error" means in
the tolerance rule:

    |kernel - ref|.max() <= rtol * |pytorch_lowprec - ref|.max() + atol

with rtol = 2 and atol the rounding noise of the output dtype (FlashAttention's
tests use exactly this).  ``attention_ref_varlen`` does variable-length
batches by splitting them.  ``sdpa_ref`` is torch SDPA's maths restated in
(batch, heads, seqlen, head_dim) layout with the top-left causal mask, the
reference of the SDPA drop-in, torch's registry route and the integrations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def local_mask(
    seqlen_q: int,
    seqlen_k: int,
    window_size: tuple[int, int] = (-1, -1),
    causal: bool = False,
    device=None,
) -> torch.Tensor:
    """Boolean (seqlen_q, seqlen_k) mask, True where the key is *masked out*.

    Bottom-right alignment: query i sits at key position i + seqlen_k - seqlen_q.
    It sees key j when i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right
    (-1 = unbounded on that side); causal is window (-1, 0).
    """
    left, right = window_size
    if causal:
        right = 0
    row = torch.arange(seqlen_q, device=device).view(-1, 1) + (seqlen_k - seqlen_q)
    col = torch.arange(seqlen_k, device=device).view(1, -1)
    masked = torch.zeros(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right >= 0:
        masked |= col > row + right
    if left >= 0:
        masked |= col < row - left
    return masked


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    upcast: bool = True,
    sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q (b, sq, hq, d) over k, v (b, sk, hk, d); returns (out, lse).

    ``sink`` (hq,): a learnable sink logit per head, one more column of every row's softmax that
    carries no value (lse includes it).

    ``out`` is (b, sq, hq, d) -- float32 when ``upcast`` else q's dtype --
    and ``lse`` float32 (b, hq, sq), natural log.  Query rows that see no key
    give out = 0 and lse = -inf, as the kernels do.
    """
    batch, seqlen_q, nheads_q, head_dim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    compute_dtype = torch.float32 if upcast else q.dtype
    q, k, v = (t.to(compute_dtype) for t in (q, k, v))
    if nheads_kv != nheads_q:
        # GQA: query head h reads kv head h // (nheads_q // nheads_kv).
        group = nheads_q // nheads_kv
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)

    # q is scaled before the product, as in FlashAttention's reference.
    scores = torch.einsum("bthd,bshd->bhts", q * softmax_scale, k)  # (b, hq, sq, sk)
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    masked = local_mask(seqlen_q, seqlen_k, window_size, causal, device=q.device)
    scores = scores.masked_fill(masked, float("-inf"))
    if sink is not None:  # the sink column, dropped again after the softmax
        sink_col = sink.to(scores.dtype).view(1, -1, 1, 1).expand(batch, -1, seqlen_q, 1)
        scores = torch.cat([scores, sink_col], dim=-1)
        masked = torch.cat([masked, torch.zeros_like(masked[..., :1])], dim=-1)
    lse = torch.logsumexp(scores.float(), dim=-1)  # (b, hq, sq)
    attn = torch.softmax(scores, dim=-1)
    # A row with every key masked is NaN after softmax; the kernels give 0.
    attn = attn.masked_fill(masked.all(dim=-1, keepdim=True), 0.0).to(v.dtype)
    if sink is not None:
        attn = attn[..., :seqlen_k]
    out = torch.einsum("bhts,bshd->bthd", attn, v)
    return out, lse


def attention_ref_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    seqused_q: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen attention by splitting: q (total_q, hq, d), k/v (total_k, hk, d).

    Sequence i is rows cu_seqlens_q[i]:cu_seqlens_q[i+1] of q (likewise k, v), of which only
    the first seqused_q[i] (seqused_k[i]) take part when given.  Returns out (total_q, hq, d)
    and lse (hq, total_q), FlashAttention's varlen layout; rows outside every used part (and
    rows that see no key) get out 0 and lse -inf.  Differentiable (built with torch.cat).
    ``kwargs`` go to :func:`attention_ref` (causal, window_size, softmax_scale, upcast).
    """
    bounds_q = cu_seqlens_q.tolist()
    bounds_k = cu_seqlens_k.tolist()
    if len(bounds_q) != len(bounds_k):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must describe the same number of sequences")
    used_q = None if seqused_q is None else seqused_q.tolist()
    used_k = None if seqused_k is None else seqused_k.tolist()
    out_dtype = torch.float32 if kwargs.get("upcast", True) else q.dtype
    heads = q.size(1)

    def gap(rows):  # rows outside every used part
        return (q.new_zeros(rows, heads, v.size(-1), dtype=out_dtype),
                torch.full((heads, rows), float("-inf"), device=q.device))

    outs, lses, row = [], [], 0
    for i in range(len(bounds_q) - 1):
        start_q, start_k = bounds_q[i], bounds_k[i]
        len_q = bounds_q[i + 1] - start_q if used_q is None else used_q[i]
        len_k = bounds_k[i + 1] - start_k if used_k is None else used_k[i]
        if start_q > row:
            o, l = gap(start_q - row)
            outs.append(o)
            lses.append(l)
        if len_q:
            if len_k:
                qi = q[start_q : start_q + len_q].unsqueeze(0)
                ki = k[start_k : start_k + len_k].unsqueeze(0)
                vi = v[start_k : start_k + len_k].unsqueeze(0)
                out, lse = attention_ref(qi, ki, vi, **kwargs)
                outs.append(out[0])
                lses.append(lse[0])
            else:  # no key: out 0, lse -inf, or the sink's logit when there is one
                o, l = gap(len_q)
                if kwargs.get("sink") is not None:
                    l = kwargs["sink"].float().view(-1, 1).expand(heads, len_q).to(l.device)
                outs.append(o)
                lses.append(l)
        row = start_q + len_q
    if q.size(0) > row:
        o, l = gap(q.size(0) - row)
        outs.append(o)
        lses.append(l)
    if not outs:
        return gap(0)
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)


def attention_ref_chunked(q, k, v, *, chunk, causal=False, window_size=(-1, -1), upcast=True, softmax_scale=None,
                          softcap=0.0):
    """softmax over the keys of each query's chunk (and causal / window), bottom-right aligned; softcap as
    in attention_ref."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    dt = torch.float32 if upcast else q.dtype
    q, k, v = (t.to(dt) for t in (q, k, v))
    k, v = (t.repeat_interleave(hq // hk, dim=2) for t in (k, v))
    scale = softmax_scale or 1 / math.sqrt(d)
    s = torch.einsum("bthd,bshd->bhts", q * scale, k)
    if softcap > 0:
        s = torch.tanh(s / softcap) * softcap
    pos = torch.arange(sq, device=q.device)[:, None] + sk - sq
    j = torch.arange(sk, device=q.device)[None, :]
    hidden = torch.div(pos, chunk, rounding_mode="floor") != torch.div(j, chunk, rounding_mode="floor")
    left, right = window_size
    if causal:
        right = 0
    if right >= 0:
        hidden |= j > pos + right
    if left >= 0:
        hidden |= j < pos - left
    s = s.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(s.float(), dim=-1)
    p = torch.softmax(s, dim=-1).masked_fill(hidden.all(-1, keepdim=True), 0.0).to(v.dtype)
    return torch.einsum("bhts,bshd->bthd", p, v), lse


def attention_ref_chunked_varlen(q, k, v, cu_q, cu_k, used_q=None, used_k=None, upcast=True, **kwargs):
    """attention_ref_chunked per sequence of packed rows; rows outside every used part get 0 / -inf."""
    bq, bk = cu_q.tolist(), cu_k.tolist()
    dt = torch.float32 if upcast else q.dtype
    outs, lses, row = [], [], 0
    for b in range(len(bq) - 1):
        nq = bq[b + 1] - bq[b] if used_q is None else int(used_q[b])
        nk = bk[b + 1] - bk[b] if used_k is None else int(used_k[b])
        gap = bq[b] - row
        outs.append(q.new_zeros(gap, q.size(1), v.size(-1), dtype=dt))
        lses.append(torch.full((q.size(1), gap), float("-inf"), device=q.device))
        if nq and nk:
            o, lse = attention_ref_chunked(q[None, bq[b]:bq[b] + nq], k[None, bk[b]:bk[b] + nk], v[None, bk[b]:bk[b] + nk],
                                 upcast=upcast, **kwargs)
            outs.append(o[0].to(dt))
            lses.append(lse[0])
        elif nq:
            outs.append(q.new_zeros(nq, q.size(1), v.size(-1), dtype=dt))
            lses.append(torch.full((q.size(1), nq), float("-inf"), device=q.device))
        row = bq[b] + nq
    outs.append(q.new_zeros(q.size(0) - row, q.size(1), v.size(-1), dtype=dt))
    lses.append(torch.full((q.size(1), q.size(0) - row), float("-inf"), device=q.device))
    return torch.cat(outs), torch.cat(lses, dim=1)


def sdpa_ref(q, k, v, is_causal=False, scale=None, upcast=True):
    """softmax(q kᵀ · scale + top-left causal mask) v for q (b, hq, L, e), k/v (b, hk, S, e); GQA by repetition.

    In float32 (``upcast``) the reference; in the inputs' dtype "PyTorch's own low-precision error".
    """
    dtype = torch.float32 if upcast else q.dtype
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    group = q.size(1) // k.size(1)
    q, k, v = q.to(dtype), k.to(dtype).repeat_interleave(group, 1), v.to(dtype).repeat_interleave(group, 1)
    scores = (q * scale) @ k.transpose(-2, -1)
    if is_causal:
        keep = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# --------------------------------------------------------------------------
# FlashAttention's tolerance rule
# --------------------------------------------------------------------------


@dataclass
class ToleranceReport:
    name: str
    error: float  # max |actual - ref| over finite entries
    pytorch_error: float  # max |lowprec - ref|
    bound: float  # rtol * pytorch_error + atol
    mismatched_infinities: int  # entries where exactly one of actual/ref is infinite, or signs differ
    nan_count: int

    @property
    def ok(self) -> bool:
        return self.nan_count == 0 and self.mismatched_infinities == 0 and self.error <= self.bound

    def __str__(self) -> str:
        return (
            f"{self.name}: max error {self.error:.3e} vs bound {self.bound:.3e} "
            f"(= rtol x pytorch low-precision error {self.pytorch_error:.3e} + atol); "
            f"NaNs {self.nan_count}, mismatched infinities {self.mismatched_infinities}"
        )


def rounding_noise(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """FlashAttention's atol: twice the rounding error of ``dtype`` at magnitude ~0.3 around ``ref``."""
    r = ref.detach().to(dtype)
    finite = torch.isfinite(r)
    if not bool(finite.any()):
        return 0.0
    r = r[finite]
    return 2.0 * float((r + 0.3 - 0.3 - r).abs().max())


def fa_tolerance_report(
    actual: torch.Tensor,
    ref: torch.Tensor,
    lowprec: torch.Tensor,
    *,
    name: str = "out",
    rtol: float = 2.0,
    atol: float | None = None,
    noise_dtype: torch.dtype | None = None,
) -> ToleranceReport:
    """Compare ``actual`` against ``ref`` with FlashAttention's relative rule.

    ``lowprec`` is the same maths done by PyTorch in the inputs' precision
    (``attention_ref(..., upcast=False)``).  ``atol`` defaults to the rounding
    noise of ``noise_dtype`` (default: ``actual``'s dtype).  Infinite entries
    of ``ref`` (lse of a row that sees no key) must match exactly.
    """
    if actual.shape != ref.shape or lowprec.shape != ref.shape:
        raise AssertionError(
            f"{name}: shapes differ: actual {tuple(actual.shape)}, ref {tuple(ref.shape)}, "
            f"lowprec {tuple(lowprec.shape)}"
        )
    a, r, p = (t.detach().float() for t in (actual, ref, lowprec))
    nan_count = int(torch.isnan(a).sum())
    ref_inf = torch.isinf(r)
    mismatched = int(((torch.isinf(a) != ref_inf) | (ref_inf & (a != r))).sum())
    finite = ~ref_inf & torch.isfinite(a)
    error = float((a - r)[finite].abs().max()) if bool(finite.any()) else 0.0
    p_finite = ~ref_inf & torch.isfinite(p)
    pytorch_error = float((p - r)[p_finite].abs().max()) if bool(p_finite.any()) else 0.0
    if atol is None:
        atol = rounding_noise(r, noise_dtype or actual.dtype)
    return ToleranceReport(name, error, pytorch_error, rtol * pytorch_error + atol, mismatched, nan_count)


def assert_fa_close(actual, ref, lowprec, **kwargs) -> ToleranceReport:
    """Raise AssertionError unless ``actual`` meets FlashAttention's rule (see fa_tolerance_report)."""
    report = fa_tolerance_report(actual, ref, lowprec, **kwargs)
    if not report.ok:
        raise AssertionError(str(report))
    return report
