"""FP8 (e4m3) forward on the GPU against a float32 reference of the de-quantized inputs, by
FlashAttention-3's FP8 rule: the error is at most 3x that of PyTorch's own FP8 maths (Q.K^T and P.V
through torch._scaled_mm, so with the tensor cores' FP8 accumulation, P rounded to e4m3, the output
to bf16) plus rounding noise. On outlier-heavy inputs the tensor cores' accumulation dominates:
FA3's FP8 forward errs exactly as much (measured, docs/decisions/080).

Every case draws fresh inputs and poisons the memory the outputs land in: odd sizes, seqlen_q !=
seqlen_k, GQA / MQA, head dims between the kernels' (80 -> 128, 176 -> 256), descales of every
(batch, KV head) and none, outlier channels (a few 100x larger, quantized with per-(batch, KV head)
scales as serving engines do), causal, windows, sinks, strided inputs, varlen with empty sequences.
"""

from __future__ import annotations

import math

import pytest
import torch

from flash_attn_hopper import flash_attn_func, flash_attn_varlen_func, manifest

from flash_attn_hopper import _build_info
from helpers.inputs import poison_allocations

pytestmark = pytest.mark.gpu

FP8 = torch.float8_e4m3fn


def skip_unless_fp8(head_dim: int) -> None:
    compiled = _build_info.COMPILED
    hdim = next(d for d in (64, 128, 256) if head_dim <= d)
    if compiled is not None and manifest.Instantiation("fp8", hdim, "fp8") not in compiled:
        pytest.skip(f"this build has no FP8 kernels for hdim {hdim} ({manifest.ENV_DTYPES} without fp8)")


def quantize(x, heads_kv, gen, descale: bool):
    """x (b, s, h, d) float32 -> (e4m3 tensor, descale (b, heads_kv) or None): scales from each
    (batch, KV head)'s absolute max, as engines quantize a layer's K/V cache."""
    if not descale:
        return x.clamp(-448, 448).to(FP8), None  # e4m3fn has no infinity: out-of-range casts give NaN
    b, s, h, d = x.shape
    amax = x.abs().reshape(b, s, heads_kv, h // heads_kv, d).amax(dim=(1, 3, 4)).clamp_min(1e-6)
    scale = amax / 448.0  # (b, heads_kv)
    per_head = scale.repeat_interleave(h // heads_kv, dim=1)[:, None, :, None]
    return (x / per_head).to(FP8), scale.float().contiguous()


def draw(shape, gen, outliers: bool):
    x = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32)
    if outliers:  # a few channels 100x larger
        x[..., :: max(1, shape[-1] // 4)] *= 100.0
    return x


def dequant(t, descale):
    """(b, s, h, d) e4m3 with a (b, heads_kv) descale -> float32 (each of t's heads takes its KV head's)."""
    x = t.float()
    if descale is None:
        return x
    return x * descale.repeat_interleave(t.shape[2] // descale.shape[1], dim=1)[:, None, :, None]


def _pad16(x):
    """A 2-D e4m3 matrix zero-padded to multiples of 16 (torch._scaled_mm's alignment)."""
    out = torch.zeros(-(-x.shape[0] // 16) * 16, -(-x.shape[1] // 16) * 16, dtype=x.dtype, device=x.device)
    out[: x.shape[0], : x.shape[1]] = x
    return out


def _fp8_mm(a, b_t):
    """a (m, k) @ b_t (n, k)^T of e4m3 matrices on the tensor cores, float32 (m, n): torch._scaled_mm
    with fast accumulation, which keeps the whole sum in the tensor cores' accumulator as the
    kernels' chained WGMMAs do."""
    one = torch.ones((), device=a.device)
    return torch._scaled_mm(_pad16(a), _pad16(b_t).t(), scale_a=one, scale_b=one, out_dtype=torch.float32,
                            use_fast_accum=True)[: a.shape[0], : b_t.shape[0]]


def _mask(s, sq, sk, causal, window, chunk=0):
    """Bottom-right causal / window / attention_chunk (FA3's: only the keys of the query's chunk)."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq, device=s.device)[:, None] + sk - sq
    j = torch.arange(sk, device=s.device)[None, :]
    visible = torch.ones(sq, sk, dtype=torch.bool, device=s.device)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    if chunk:
        visible &= torch.div(j, chunk, rounding_mode="floor") == torch.div(i, chunk, rounding_mode="floor")
    return s.masked_fill(~visible, -math.inf)


def _cap(s, softcap):
    return softcap * torch.tanh(s / softcap) if softcap else s


def _softmax(s, sink):
    """(p without the sink's column, lse), rows without keys 0 / -inf."""
    b, hq, sq, _ = s.shape
    if sink is not None:
        s = torch.cat([s, sink.float()[None, :, None, None].expand(b, hq, sq, 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None].clamp_min(-1e30)).nan_to_num(0.0)
    return (p[..., :-1] if sink is not None else p), lse


def reference(q8, k8, v8, descales, *, scale, causal=False, window=(-1, -1), sink=None, softcap=0.0, chunk=0):
    """Float32 attention of the de-quantized inputs: (out, lse)."""
    q, k, v = (dequant(t, d) for t, d in zip((q8, k8, v8), descales))
    hq = q.shape[2]
    k, v = (t.repeat_interleave(hq // t.shape[2], dim=2) for t in (k, v))
    s = _cap(torch.einsum("bqhd,bkhd->bhqk", q, k) * scale, softcap)
    s = _mask(s, q.shape[1], k.shape[1], causal, window, chunk)
    p, lse = _softmax(s, sink)
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def emulated(q8, k8, v8, descales, *, scale, causal=False, window=(-1, -1), sink=None, softcap=0.0, chunk=0):
    """PyTorch's FP8 maths for the same attention: Q.K^T and P.V on the tensor cores in e4m3
    (torch._scaled_mm), descales in float32, P rounded to e4m3 as 256 * exp(s - rowmax) (FA3's
    offset), the output to bf16: (out, lse)."""
    b, sq, hq, d = q8.shape
    sk, hk = k8.shape[1], k8.shape[2]
    ones = torch.ones(b, hk, device=q8.device)
    qd, kd, vd = (ones if t is None else t for t in descales)
    s = torch.empty(b, hq, sq, sk, device=q8.device)
    for i in range(b):
        for h in range(hq):
            g = h // (hq // hk)
            s[i, h] = _fp8_mm(q8[i, :, h], k8[i, :, g]) * (qd[i, g] * kd[i, g] * scale)
    s = _mask(_cap(s, softcap), sq, sk, causal, window, chunk)
    _, lse = _softmax(s, sink)
    row_max = s.amax(dim=-1, keepdim=True)
    p8 = (torch.exp(s - row_max.clamp_min(-1e30)).nan_to_num(0.0) * 256).to(FP8)
    norm = (torch.exp(row_max - lse[..., None]) / 256).nan_to_num(0.0)  # 1 / (256 * the row's sum), 0 if empty
    out = torch.empty(b, sq, hq, d, device=q8.device)
    for i in range(b):
        for h in range(hq):
            g = h // (hq // hk)
            out[i, :, h] = _fp8_mm(p8[i, h], v8[i, :, g].t().contiguous()) * norm[i, h] * vd[i, g]
    return out.to(torch.bfloat16).float(), lse


def check_close(out, lse, q8, k8, v8, descales, *, scale, **kw):
    """FA3's FP8 rule: out within 3x PyTorch's FP8 maths' error of the float32 reference (plus
    rounding noise), the LSE within 3x its LSE error plus 2e-3."""
    ref, ref_lse = reference(q8, k8, v8, descales, scale=scale, **kw)
    pt, pt_lse = emulated(q8, k8, v8, descales, scale=scale, **kw)
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape
    noise = 2 * (ref + 0.3 - 0.3 - ref).abs().max().item() + 1e-5
    err, pt_err = (out.float() - ref).abs().max().item(), (pt - ref).abs().max().item()
    assert err <= 3 * pt_err + noise, f"out: max error {err:.3e} > 3 x PyTorch FP8's {pt_err:.3e} + {noise:.1e}"
    finite = ref_lse.isfinite()
    assert torch.equal(lse.isfinite(), finite)
    if finite.any():
        lse_err = (lse[finite] - ref_lse[finite]).abs().max().item()
        pt_lse_err = (pt_lse[finite] - ref_lse[finite]).abs().max().item()
        assert lse_err <= 3 * pt_lse_err + 2e-3, f"lse: max error {lse_err:.3e} > 3 x PyTorch FP8's {pt_lse_err:.3e}"


@pytest.mark.parametrize("head_dim", [64, 128, 256, 80, 176])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("descale", [True, False], ids=["descale", "none"])
@pytest.mark.parametrize("outliers", [False, True], ids=["randn", "outliers"])
@pytest.mark.parametrize("batch, seqlen_q, seqlen_k, heads_q, heads_kv",
                         [(2, 128, 128, 4, 4), (2, 113, 1029, 6, 2), (1, 1, 517, 8, 1), (3, 333, 190, 4, 1)])
def test_fp8_dense(head_dim, causal, descale, outliers, batch, seqlen_q, seqlen_k, heads_q, heads_kv):
    skip_unless_fp8(head_dim)
    gen = torch.Generator(device="cuda").manual_seed(hash((head_dim, causal, descale, outliers, seqlen_q)) % 2**31)
    q8, qd = quantize(draw((batch, seqlen_q, heads_q, head_dim), gen, outliers), heads_kv, gen, descale)
    k8, kd = quantize(draw((batch, seqlen_k, heads_kv, head_dim), gen, outliers), heads_kv, gen, descale)
    v8, vd = quantize(draw((batch, seqlen_k, heads_kv, head_dim), gen, outliers), heads_kv, gen, descale)
    poison_allocations(((batch, seqlen_q, heads_q, head_dim), torch.bfloat16),
                       ((batch, heads_q, seqlen_q), torch.float32))
    scale = head_dim ** -0.5 * (0.1 if outliers else 1.0)
    out, lse = flash_attn_func(q8, k8, v8, softmax_scale=scale, causal=causal, q_descale=qd, k_descale=kd,
                               v_descale=vd, return_attn_probs=True)
    check_close(out, lse, q8, k8, v8, (qd, kd, vd), scale=scale, causal=causal)


def check_dense_call(head_dim, causal, gen, batch, sq, sk, hq, hk):
    """One dense FP8 call with per-(batch, KV head) descales and poisoned outputs, checked one batch
    entry at a time (the references' (heads, sq, sk) scores)."""
    q8, qd = quantize(draw((batch, sq, hq, head_dim), gen, False), hk, gen, True)
    k8, kd = quantize(draw((batch, sk, hk, head_dim), gen, False), hk, gen, True)
    v8, vd = quantize(draw((batch, sk, hk, head_dim), gen, False), hk, gen, True)
    poison_allocations(((batch, sq, hq, head_dim), torch.bfloat16), ((batch, hq, sq), torch.float32))
    out, lse = flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd,
                               return_attn_probs=True)
    for b in range(batch):
        check_close(out[b : b + 1], lse[b : b + 1], q8[b : b + 1], k8[b : b + 1], v8[b : b + 1],
                    (qd[b : b + 1], kd[b : b + 1], vd[b : b + 1]), scale=head_dim ** -0.5, causal=causal)


@pytest.mark.parametrize("head_dim", [128, 96, 64, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_more_tiles_than_sms(head_dim, causal):
    """Several tiles per CTA where the kernels stride over them (persistent, decision 084): 720 tiles of
    odd sizes, each with its batch entry's and KV head's descales, 4096+ keys (the long-key tiles)."""
    skip_unless_fp8(head_dim)
    gen = torch.Generator(device="cuda").manual_seed(head_dim + 3 * causal)
    check_dense_call(head_dim, causal, gen, batch=3, sq=600, sk=4133, hq=48, hk=6)


@pytest.mark.parametrize("head_dim,causal,sk", [(64, False, 8300), (256, True, 16500)])
def test_fp8_kernels_past_their_own_long_keys_switch(head_dim, causal, sk):
    """Key lengths past the switches FwdFp8Dense::long_keys moves from 4k keys (policy.h: non-causal
    hdim 64 at 8k, masked hdim 256 at 16k), so that those long-keys kernels run too."""
    skip_unless_fp8(head_dim)
    gen = torch.Generator(device="cuda").manual_seed(sk + causal)
    check_dense_call(head_dim, causal, gen, batch=2, sq=333, sk=sk, hq=4, hk=2)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_zero_descale_gives_uniform_attention(head_dim, causal):
    """A q_descale of 0 makes every score 0: uniform attention over the keys a row sees, no NaN, and
    with causal and more queries than keys, rows without keys (0, LSE -inf) ahead of the blocks no
    row sees masked (the softmax's unchecked path, whose scale is kept positive)."""
    skip_unless_fp8(head_dim)
    gen = torch.Generator(device="cuda").manual_seed(7 * head_dim + causal)
    batch, sq, sk, hq, hk = 2, 700, 450, 4, 2
    q8, qd = quantize(draw((batch, sq, hq, head_dim), gen, False), hk, gen, True)
    k8, kd = quantize(draw((batch, sk, hk, head_dim), gen, False), hk, gen, True)
    v8, vd = quantize(draw((batch, sk, hk, head_dim), gen, False), hk, gen, True)
    qd[1] = 0.0
    poison_allocations(((batch, sq, hq, head_dim), torch.bfloat16), ((batch, hq, sq), torch.float32))
    out, lse = flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd,
                               return_attn_probs=True)
    assert not out.isnan().any()
    check_close(out, lse, q8, k8, v8, (qd, kd, vd), scale=head_dim ** -0.5, causal=causal)
    # The varlen kernels (other softmax schedules) on the same batch, packed.
    cu_q, cu_k = (torch.arange(0, (batch + 1) * n, n, dtype=torch.int32, device="cuda") for n in (sq, sk))
    out_v, lse_v = flash_attn_varlen_func(q8.flatten(0, 1), k8.flatten(0, 1), v8.flatten(0, 1), cu_q, cu_k, sq, sk,
                                          causal=causal, q_descale=qd, k_descale=kd, v_descale=vd,
                                          return_attn_probs=True)
    assert not out_v.isnan().any()
    check_close(out_v.view_as(out), lse_v.view(hq, batch, sq).transpose(0, 1), q8, k8, v8, (qd, kd, vd),
                scale=head_dim ** -0.5, causal=causal)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_fp8_window_sink_strides(head_dim):
    """A sliding window, a learnable sink, q and v read through strides, expanded descales."""
    skip_unless_fp8(head_dim)
    gen = torch.Generator(device="cuda").manual_seed(head_dim)
    batch, sq, sk, hq, hk = 2, 300, 457, 8, 2
    wide = draw((batch, sq, hq, head_dim + 32), gen, False).to(FP8)
    q8 = wide[..., 16 : 16 + head_dim]
    k8 = draw((batch, sk, hk, head_dim), gen, False).to(FP8)
    v8 = draw((batch, hk, sk, head_dim), gen, False).to(FP8).transpose(1, 2)
    assert not q8.is_contiguous() and not v8.is_contiguous()
    qd = torch.full((1, 1), 0.7, device="cuda").expand(batch, hk)  # a per-layer scale, expanded
    kd = torch.rand((batch, hk), generator=gen, device="cuda") + 0.5
    sink = torch.randn(hq, generator=gen, device="cuda")
    window = (61, 17)
    out, lse = flash_attn_func(q8, k8, v8, window_size=window, q_descale=qd, k_descale=kd, learnable_sink=sink,
                               return_attn_probs=True)
    check_close(out, lse, q8, k8, v8, (qd, kd, None), scale=head_dim ** -0.5, window=window, sink=sink)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_varlen(head_dim, causal):
    """Sequences of lengths 0, 1 and odd sizes, descales per sequence and KV head; each sequence
    against the dense reference."""
    skip_unless_fp8(head_dim)
    gen = torch.Generator(device="cuda").manual_seed(head_dim + causal)
    lens_q, lens_k, hq, hk = [0, 1, 190, 77, 300], [5, 1, 260, 0, 300], 6, 3
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q8 = draw((sum(lens_q), hq, head_dim), gen, False).to(FP8)
    k8 = draw((sum(lens_k), hk, head_dim), gen, False).to(FP8)
    v8 = draw((sum(lens_k), hk, head_dim), gen, False).to(FP8)
    qd, kd, vd = (torch.rand((len(lens_q), hk), generator=gen, device="cuda") + 0.5 for _ in range(3))
    poison_allocations(((sum(lens_q), hq, head_dim), torch.bfloat16), ((hq, sum(lens_q)), torch.float32))
    out, lse = flash_attn_varlen_func(q8, k8, v8, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                      q_descale=qd, k_descale=kd, v_descale=vd, return_attn_probs=True)
    assert out.shape == (sum(lens_q), hq, head_dim) and lse.shape == (hq, sum(lens_q))
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        if lq == 0:
            continue
        rows = slice(int(cu_q[b]), int(cu_q[b]) + lq)
        keys = slice(int(cu_k[b]), int(cu_k[b]) + lk)
        if lk == 0:
            assert (out[rows] == 0).all() and torch.isneginf(lse[:, rows]).all()
            continue
        one = lambda t, d: (t[None], None if d is None else d[b : b + 1])  # noqa: E731
        (qb, qdb), (kb, kdb), (vb, vdb) = one(q8[rows], qd), one(k8[keys], kd), one(v8[keys], vd)
        check_close(out[rows][None], lse[:, rows][None], qb, kb, vb, (qdb, kdb, vdb), scale=head_dim ** -0.5,
                    causal=causal)


def test_fp8_refusals_on_the_gpu():
    """Mixed dtypes, descales of the wrong shape, and gradients: clear errors, nothing launched."""
    skip_unless_fp8(128)
    q = torch.randn(1, 64, 2, 128, device="cuda").to(FP8)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        flash_attn_func(q, q, q.to(torch.bfloat16))
    with pytest.raises(ValueError, match=r"\(batch, nheads_kv\) = \(1, 2\)"):
        flash_attn_func(q, q, q, q_descale=torch.ones(2, 1, device="cuda"))
    with pytest.raises(ValueError, match="applies to FP8"):
        flash_attn_func(*(torch.randn(1, 64, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3)),
                        k_descale=torch.ones(1, 2, device="cuda"))
    pages = torch.zeros(4, 16, 2, 128, device="cuda").to(FP8)
    with pytest.raises(ValueError, match="one head dim"):  # dv != d over a paged FP8 cache
        flash_attn_varlen_func(q[0], pages, pages[..., :64], torch.tensor([0, 64], dtype=torch.int32, device="cuda"),
                               None, 64, 64, seqused_k=torch.tensor([40], dtype=torch.int32, device="cuda"),
                               page_table=torch.zeros(1, 4, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="seqused_k"):
        flash_attn_varlen_func(q[0], pages, pages, torch.tensor([0, 64], dtype=torch.int32, device="cuda"), None, 64,
                               64, page_table=torch.zeros(1, 4, dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_softcap_chunk_and_hints(head_dim, causal):
    """softcap (the descales inside the cap), attention_chunk (the varlen kernels over the chunk
    segments, descales per segment), num_splits / pack_gqa (hints dense FP8 calls do not take)."""
    skip_unless_fp8(head_dim)
    gen = torch.Generator(device="cuda").manual_seed(head_dim * 2 + causal)
    batch, sq, sk, hq, hk = 2, 201, 333, 6, 2
    q8, qd = quantize(draw((batch, sq, hq, head_dim), gen, False) * 4, hk, gen, True)
    k8, kd = quantize(draw((batch, sk, hk, head_dim), gen, False), hk, gen, True)
    v8, vd = quantize(draw((batch, sk, hk, head_dim), gen, False), hk, gen, True)
    scale = head_dim ** -0.5
    for kwargs, ref_kwargs in ((dict(softcap=15.0), dict(softcap=15.0)),
                               (dict(attention_chunk=97), dict(chunk=97)),
                               (dict(attention_chunk=64, softcap=5.0), dict(chunk=64, softcap=5.0)),
                               (dict(num_splits=3, pack_gqa=True), dict())):
        out, lse = flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd,
                                   return_attn_probs=True, **kwargs)
        check_close(out, lse, q8, k8, v8, (qd, kd, vd), scale=scale, causal=causal, **ref_kwargs)
    # varlen with attention_chunk: descales per sequence, expanded per chunk segment
    cu_q = torch.tensor([0, 77, sq], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 150, sk], dtype=torch.int32, device="cuda")
    qv_, kv_, vv_ = (t[0] for t in (q8, k8, v8))  # one batch entry split into two sequences
    ds = [torch.rand((2, hk), generator=gen, device="cuda") + 0.5 for _ in range(3)]
    out, lse = flash_attn_varlen_func(qv_, kv_, vv_, cu_q, cu_k, 124, 183, causal=causal, attention_chunk=50,
                                      q_descale=ds[0], k_descale=ds[1], v_descale=ds[2], return_attn_probs=True)
    for b in range(2):
        rows, keys = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        check_close(out[rows][None], lse[:, rows][None], qv_[rows][None], kv_[keys][None], vv_[keys][None],
                    tuple(d[b : b + 1] for d in ds), scale=scale, causal=causal, chunk=50)


def test_fp8_runs_forward_on_inputs_that_require_grad_and_refuses_the_backward():
    """FA3's tests pass FP8 inputs that require grad: the forward runs, the backward raises."""
    skip_unless_fp8(128)
    q, k, v = (torch.randn(1, 96, 2, 128, device="cuda").to(FP8).requires_grad_() for _ in range(3))
    out = flash_attn_func(q, k, v)
    assert out.dtype == torch.bfloat16 and out.requires_grad
    with pytest.raises(RuntimeError, match="FP8 attention has no backward"):
        out.float().sum().backward()


def test_fp8_behind_torchs_quantized_flash_ops():
    """torch's registry: activated, aten's `.quantized` flash overloads (torch's FP8 SDPA) run the FP8
    kernels; the results are flash_attn_func's (BHSD and BSHD) and flash_attn_varlen_func's (packed)
    bit for bit. (The dense and varlen kernels need not agree bitwise: their softmax schedules differ.)"""
    skip_unless_fp8(128)
    from torch.nn import attention

    from flash_attn_hopper import torch_registry

    if not torch_registry.has_aten_op("_scaled_dot_product_flash_attention.quantized"):
        pytest.skip(f"torch {torch.__version__} has no .quantized flash overloads")
    gen = torch.Generator(device="cuda").manual_seed(5)
    b, s, hq, hk, d = 2, 300, 8, 2, 128
    q, k, v = (draw((b, s, h, d), gen, False).to(FP8) for h in (hq, hk, hk))
    qd, kd, vd = (torch.rand((b, hk), generator=gen, device="cuda") + 0.5 for _ in range(3))
    want = flash_attn_func(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    attention.activate_flash_attention_impl(torch_registry.IMPL_NAME)
    try:
        out = torch.ops.aten._scaled_dot_product_flash_attention.quantized(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), qd, kd, vd, 0.0, True, False)[0]
        assert out.dtype == torch.bfloat16 and torch.equal(out.transpose(1, 2), want)
        out = torch.ops.aten._flash_attention_forward.quantized(q, k, v, None, None, s, s, 0.0, True, False, qd, kd,
                                                                 vd)[0]
        assert torch.equal(out, want)
        cu = torch.tensor([0, s, 2 * s], dtype=torch.int32, device="cuda")
        packed = (q.reshape(-1, hq, d), k.reshape(-1, hk, d), v.reshape(-1, hk, d))
        want_varlen = flash_attn_varlen_func(*packed, cu, cu, s, s, causal=True, q_descale=qd, k_descale=kd,
                                             v_descale=vd)
        out = torch.ops.aten._flash_attention_forward.quantized(*packed, cu, cu, s, s, 0.0, True, False, qd, kd,
                                                                 vd)[0]
        assert torch.equal(out, want_varlen)
        with pytest.raises((ValueError, RuntimeError), match="descale"):  # ours, not torch's missing FA3
            torch.ops.aten._flash_attention_forward.quantized(q, k, v, None, None, s, s, 0.0, True, False,
                                                              qd[:1], kd, vd)
    finally:
        attention.restore_flash_attention_impl()


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_fp8_contiguous_kv_cache_with_appends(head_dim):
    """flash_attn_with_kvcache over an FP8 cache: new keys appended in place (bytes), descales per
    sequence and KV head, causal decode-like queries; each sequence against the reference."""
    skip_unless_fp8(head_dim)
    from flash_attn_hopper import flash_attn_with_kvcache

    gen = torch.Generator(device="cuda").manual_seed(head_dim + 7)
    b, cache, new, hq, hk = 3, 300, 5, 8, 2
    k_cache, v_cache = (draw((b, cache, hk, head_dim), gen, False).to(FP8) for _ in range(2))
    k_new, v_new = (draw((b, new, hk, head_dim), gen, False).to(FP8) for _ in range(2))
    q = draw((b, new, hq, head_dim), gen, False).to(FP8)
    lens = torch.tensor([0, 100, 250], dtype=torch.int32, device="cuda")
    ds = [torch.rand((b, hk), generator=gen, device="cuda") + 0.5 for _ in range(3)]
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lens, causal=True,
                                       q_descale=ds[0], k_descale=ds[1], v_descale=ds[2], return_softmax_lse=True)
    assert out.dtype == torch.bfloat16 and out.shape == (b, new, hq, head_dim)
    for i in range(b):
        end = int(lens[i]) + new
        assert torch.equal(k_cache[i, end - new : end].view(torch.uint8), k_new[i].view(torch.uint8))
        assert torch.equal(v_cache[i, end - new : end].view(torch.uint8), v_new[i].view(torch.uint8))
        check_close(out[i : i + 1], lse[i : i + 1], q[i : i + 1], k_cache[i : i + 1, :end], v_cache[i : i + 1, :end],
                    tuple(d[i : i + 1] for d in ds), scale=head_dim ** -0.5, causal=True)


def paged_copy(k, v, page_size, gen):
    """(b, s, hk, d) caches -> (k_pages, v_pages, page_table): each sequence's rows in pages of
    page_size, the pages shuffled among spare ones; unused pages and rows past s hold NaN bytes, so a
    kernel reading them (instead of zero-filling past a sequence's keys) shows."""
    b, s, hk, d = k.shape
    per = -(-s // page_size)
    num = b * per + 5
    order = torch.randperm(num, generator=torch.Generator().manual_seed(page_size))[: b * per]
    table = order.view(b, per).to(torch.int32).cuda()
    pages = []
    for t in (k, v):
        padded = torch.full((b, per * page_size, hk, d), 0x7F, dtype=torch.uint8, device="cuda")  # e4m3fn NaN
        padded[:, :s] = t.view(torch.uint8)
        store = torch.full((num, page_size, hk, d), 0x7F, dtype=torch.uint8, device="cuda")
        store[order.cuda()] = padded.view(b * per, page_size, hk, d)
        pages.append(store.view(FP8))
    return pages[0], pages[1], table


@pytest.mark.parametrize("head_dim", [64, 128, 256, 80])
@pytest.mark.parametrize("page_size", [1, 16, 64, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_paged_varlen(head_dim, page_size, causal):
    """vLLM's call: flash_attn_varlen_func over a paged FP8 cache (page_table, seqused_k, no
    cu_seqlens_k), descales per sequence and KV head, queries of 1 to many rows (0 keys, 1 key and
    keys past a block); each sequence against the reference of its contiguous keys."""
    skip_unless_fp8(head_dim)
    gen = torch.Generator(device="cuda").manual_seed(head_dim * 7 + page_size + causal)
    lens_q, lens_k, hq, hk, cache = [1, 3, 1, 130, 0, 64], [0, 1, 700, 333, 20, 129], 8, 2, 704
    k8, v8 = (draw((len(lens_k), cache, hk, head_dim), gen, False).to(FP8) for _ in range(2))
    k_pages, v_pages, table = paged_copy(k8, v8, page_size, gen)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    used = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    q8 = draw((sum(lens_q), hq, head_dim), gen, False).to(FP8)
    qd, kd, vd = (torch.rand((len(lens_q), hk), generator=gen, device="cuda") + 0.5 for _ in range(3))
    poison_allocations(((sum(lens_q), hq, head_dim), torch.bfloat16), ((hq, sum(lens_q)), torch.float32))
    out, lse = flash_attn_varlen_func(q8, k_pages, v_pages, cu_q, None, max(lens_q), cache, seqused_k=used,
                                      page_table=table, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd,
                                      return_attn_probs=True)
    assert out.dtype == torch.bfloat16 and out.shape == (sum(lens_q), hq, head_dim)
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        rows = slice(int(cu_q[b]), int(cu_q[b]) + lq)
        if lq == 0:
            continue
        if lk == 0:
            assert (out[rows] == 0).all() and torch.isneginf(lse[:, rows]).all()
            continue
        check_close(out[rows][None], lse[:, rows][None], q8[rows][None], k8[b : b + 1, :lk], v8[b : b + 1, :lk],
                    (qd[b : b + 1], kd[b : b + 1], vd[b : b + 1]), scale=head_dim ** -0.5, causal=causal)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_fp8_paged_kv_cache_appends_window_softcap_sink(head_dim):
    """flash_attn_with_kvcache over a paged FP8 cache: new keys appended to their pages (bytes), then
    a window, softcap or a learnable sink (decode-like queries, GQA 4:1, descales per sequence)."""
    skip_unless_fp8(head_dim)
    from flash_attn_hopper import flash_attn_with_kvcache

    gen = torch.Generator(device="cuda").manual_seed(head_dim + 11)
    b, cache, new, hq, hk, page_size = 3, 320, 4, 8, 2, 16
    k8, v8 = (draw((b, cache, hk, head_dim), gen, False).to(FP8) for _ in range(2))
    k_new, v_new = (draw((b, new, hk, head_dim), gen, False).to(FP8) for _ in range(2))
    q = draw((b, new, hq, head_dim), gen, False).to(FP8)
    lens = torch.tensor([0, 101, 300], dtype=torch.int32, device="cuda")
    ds = [torch.rand((b, hk), generator=gen, device="cuda") + 0.5 for _ in range(3)]
    sink = torch.randn(hq, generator=gen, device="cuda")
    for extra in ({"window_size": (37, 0)}, {"softcap": 15.0}, {"learnable_sink": sink}):
        k_pages, v_pages, table = paged_copy(k8, v8, page_size, gen)
        out, lse = flash_attn_with_kvcache(q, k_pages, v_pages, k=k_new, v=v_new, cache_seqlens=lens, causal=True,
                                           page_table=table, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2],
                                           return_softmax_lse=True, **extra)
        assert out.dtype == torch.bfloat16 and out.shape == (b, new, hq, head_dim)
        kw = {"window": extra.get("window_size", (-1, 0)), "softcap": extra.get("softcap", 0.0),
              "sink": extra.get("learnable_sink")}
        for i in range(b):
            end = int(lens[i]) + new
            keys = torch.arange(end, device="cuda")
            rows = lambda pages: pages.view(torch.uint8)[table[i].long()[keys // page_size],  # noqa: E731
                                                         keys % page_size].view(FP8)
            kb, vb = rows(k_pages)[None], rows(v_pages)[None]
            assert torch.equal(kb[0, -new:].view(torch.uint8), k_new[i].view(torch.uint8))
            assert torch.equal(vb[0, -new:].view(torch.uint8), v_new[i].view(torch.uint8))
            check_close(out[i : i + 1], lse[i : i + 1], q[i : i + 1], kb, vb, tuple(d[i : i + 1] for d in ds),
                        scale=head_dim ** -0.5, **kw)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged16"])
def test_fp8_kv_cache_split_and_packgqa(head_dim, paged):
    """flash_attn_with_kvcache's split plans (num_splits 0 = choose, 1, 3, 8) and PackGQA (None / True /
    False) over an FP8 cache: decode (one query, packed and unpacked in the combine), non-causal
    chunks (packed, unpacked here), causal chunks (not packed), a sink (joins the combine); lengths
    0 to past a few key blocks; each sequence against the reference."""
    skip_unless_fp8(head_dim)
    from flash_attn_hopper import flash_attn_with_kvcache

    gen = torch.Generator(device="cuda").manual_seed(head_dim + paged)
    b, cache, hq, hk = 4, 1900, 8, 2
    k8, v8 = (draw((b, cache, hk, head_dim), gen, False).to(FP8) for _ in range(2))
    lens = torch.tensor([1900, 0, 1, 777], dtype=torch.int32, device="cuda")
    ds = [torch.rand((b, hk), generator=gen, device="cuda") + 0.5 for _ in range(3)]
    sink = torch.randn(hq, generator=gen, device="cuda")
    caches = paged_copy(k8, v8, 16, gen) if paged else (k8, v8, None)
    cases = [(1, False, dict(num_splits=n, pack_gqa=p)) for n in (0, 1, 3, 8) for p in (None, True, False)]
    cases += [(5, False, dict(num_splits=3, pack_gqa=True)), (5, True, dict(num_splits=0)),
              (1, False, dict(num_splits=4, learnable_sink=sink))]
    for sq, causal, kw in cases:
        q = draw((b, sq, hq, head_dim), gen, False).to(FP8)
        out, lse = flash_attn_with_kvcache(q, caches[0], caches[1], cache_seqlens=lens, page_table=caches[2],
                                           causal=causal, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2],
                                           return_softmax_lse=True, **kw)
        assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, head_dim), kw
        for i in range(b):
            n = int(lens[i])
            if n == 0:  # no keys: O = 0, the LSE -inf (or the sink's logit)
                expected = kw["learnable_sink"][:, None].expand(hq, sq) if "learnable_sink" in kw else None
                assert (out[i] == 0).all(), kw
                assert torch.isneginf(lse[i]).all() if expected is None else torch.allclose(lse[i], expected), kw
                continue
            check_close(out[i : i + 1], lse[i : i + 1], q[i : i + 1], k8[i : i + 1, :n], v8[i : i + 1, :n],
                        tuple(d[i : i + 1] for d in ds), scale=head_dim ** -0.5, causal=causal,
                        sink=kw.get("learnable_sink"))


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged16"])
def test_fp8_zero_descale_over_kv_caches(head_dim, paged):
    """A q_descale of 0 for one sequence through the cache kernels (paged gather, split-KV and its
    combine): uniform attention over the keys each row sees, no NaN, causal rows masked in the
    first block."""
    skip_unless_fp8(head_dim)
    from flash_attn_hopper import flash_attn_with_kvcache

    gen = torch.Generator(device="cuda").manual_seed(head_dim * 3 + paged)
    b, cache, sq, hq, hk = 3, 600, 5, 8, 2
    k8, v8 = (draw((b, cache, hk, head_dim), gen, False).to(FP8) for _ in range(2))
    lens = torch.tensor([600, 450, 3], dtype=torch.int32, device="cuda")
    ds = [torch.rand((b, hk), generator=gen, device="cuda") + 0.5 for _ in range(3)]
    ds[0][1] = 0.0
    caches = paged_copy(k8, v8, 16, gen) if paged else (k8, v8, None)
    q = draw((b, sq, hq, head_dim), gen, False).to(FP8)
    for splits in (1, 3):
        out, lse = flash_attn_with_kvcache(q, caches[0], caches[1], cache_seqlens=lens, page_table=caches[2],
                                           causal=True, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2],
                                           return_softmax_lse=True, num_splits=splits)
        assert not out.isnan().any() and not lse.isnan().any(), splits
        for i in range(b):
            n = int(lens[i])
            check_close(out[i : i + 1], lse[i : i + 1], q[i : i + 1], k8[i : i + 1, :n], v8[i : i + 1, :n],
                        tuple(d[i : i + 1] for d in ds), scale=head_dim ** -0.5, causal=True)
