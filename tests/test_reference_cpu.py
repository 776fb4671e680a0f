"""The oracle itself, checked on the CPU against torch's SDPA math and brute-force loops,
and the tolerance helper checked to pass good outputs and fail bad ones."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers.inputs import qkv
from reference import (
    assert_fa_close,
    attention_ref,
    attention_ref_varlen,
    fa_tolerance_report,
    local_mask,
    sdpa_ref,
)


def _inputs(b, sq, sk, hq, hk, d, dtype=torch.float32, seed=0):
    return qkv(b, sq, sk, hq, hk, d, dtype=dtype, device="cpu", seed=seed)


def _sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    """torch's math SDPA in float64, BSHD in and out."""
    qt, kt, vt = (t.double().transpose(1, 2) for t in (q, k, v))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        out = F.scaled_dot_product_attention(
            qt, kt, vt, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=qt.shape[1] != kt.shape[1]
        )
    return out.transpose(1, 2)


@pytest.mark.parametrize("b, sq, sk, hq, hk, d", [(2, 7, 7, 2, 2, 16), (1, 5, 13, 4, 1, 8), (3, 11, 4, 6, 3, 32)])
def test_matches_sdpa_non_causal_with_gqa(b, sq, sk, hq, hk, d):
    q, k, v = _inputs(b, sq, sk, hq, hk, d)
    out, _ = attention_ref(q, k, v)
    torch.testing.assert_close(out.double(), _sdpa(q, k, v), atol=2e-6, rtol=1e-5)


def test_matches_sdpa_causal_square():
    q, k, v = _inputs(2, 9, 9, 3, 3, 16)
    out, _ = attention_ref(q, k, v, causal=True)
    torch.testing.assert_close(out.double(), _sdpa(q, k, v, is_causal=True), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("sq, sk", [(3, 10), (6, 6), (1, 5)])
def test_causal_is_bottom_right_aligned(sq, sk):
    q, k, v = _inputs(2, sq, sk, 2, 2, 16, seed=1)
    # SDPA's is_causal is top-left; bottom-right shifts the diagonal by sk - sq.
    keep = torch.ones(sq, sk, dtype=torch.bool).tril(diagonal=sk - sq)
    out, _ = attention_ref(q, k, v, causal=True)
    torch.testing.assert_close(out.double(), _sdpa(q, k, v, mask=keep), atol=2e-6, rtol=1e-5)


def test_causal_row_that_sees_nothing_gives_zero_and_minus_inf():
    q, k, v = _inputs(1, 5, 2, 2, 1, 8)
    out, lse = attention_ref(q, k, v, causal=True)
    # bottom-right: query i sees keys j <= i - 3; rows 0..2 see nothing.
    assert torch.equal(out[:, :3], torch.zeros_like(out[:, :3]))
    assert torch.isneginf(lse[:, :, :3]).all()
    assert torch.isfinite(lse[:, :, 3:]).all()
    assert out[:, 3:].abs().sum() > 0


def test_empty_key_sequence_and_empty_query_sequence():
    q, k, v = _inputs(2, 4, 0, 2, 2, 8)
    out, lse = attention_ref(q, k, v)
    assert out.shape == (2, 4, 2, 8) and torch.equal(out, torch.zeros_like(out))
    assert lse.shape == (2, 2, 4) and torch.isneginf(lse).all()
    q, k, v = _inputs(2, 0, 5, 2, 2, 8)
    out, lse = attention_ref(q, k, v)
    assert out.shape == (2, 0, 2, 8) and lse.shape == (2, 2, 0)


def test_lse_and_output_against_a_loop():
    q, k, v = _inputs(1, 4, 6, 2, 1, 8, seed=3)
    scale = 0.37
    out, lse = attention_ref(q, k, v, softmax_scale=scale)
    for h in range(2):
        for i in range(4):
            s = [sum(float(q[0, i, h, c]) * float(k[0, j, 0, c]) for c in range(8)) * scale for j in range(6)]
            m = max(s)
            denom = sum(math.exp(x - m) for x in s)
            assert float(lse[0, h, i]) == pytest.approx(m + math.log(denom), rel=1e-5)
            for c in range(8):
                expected = sum(math.exp(s[j] - m) / denom * float(v[0, j, 0, c]) for j in range(6))
                assert float(out[0, i, h, c]) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("window, causal", [((2, 1), False), ((0, 0), False), ((3, -1), False), ((1, 5), True)])
@pytest.mark.parametrize("sq, sk", [(6, 6), (4, 9), (9, 4)])
def test_local_window_mask_against_a_loop(window, causal, sq, sk):
    mask = local_mask(sq, sk, window, causal)
    left, right = window
    if causal:
        right = 0
    for i in range(sq):
        for j in range(sk):
            center = i + sk - sq
            visible = (left < 0 or j >= center - left) and (right < 0 or j <= center + right)
            assert bool(mask[i, j]) == (not visible), (i, j)
    q, k, v = _inputs(1, sq, sk, 2, 2, 8)
    out, _ = attention_ref(q, k, v, window_size=window, causal=causal)
    keep = ~mask
    expected = _sdpa(q, k, v, mask=keep)
    rows = keep.any(dim=1)  # SDPA gives NaN on fully masked rows; compare the others
    torch.testing.assert_close(out.double()[:, rows], expected[:, rows], atol=2e-6, rtol=1e-5)
    assert torch.equal(out[:, ~rows], torch.zeros_like(out[:, ~rows]))


def test_causal_equals_window_minus_one_zero():
    q, k, v = _inputs(2, 5, 8, 2, 2, 8)
    a, la = attention_ref(q, k, v, causal=True)
    b, lb = attention_ref(q, k, v, window_size=(-1, 0))
    assert torch.equal(a, b) and torch.equal(la, lb)


def test_softcap():
    q, k, v = _inputs(1, 5, 7, 2, 2, 16, seed=4)
    q = q * 4  # large scores, so the cap matters
    cap = 3.0
    out, lse = attention_ref(q, k, v, softcap=cap)
    s = torch.einsum("bthd,bshd->bhts", q, k) / 4.0
    s = cap * torch.tanh(s / cap)
    torch.testing.assert_close(lse, torch.logsumexp(s, dim=-1))
    expected = torch.einsum("bhts,bshd->bthd", torch.softmax(s, dim=-1), v)
    torch.testing.assert_close(out, expected)
    uncapped, _ = attention_ref(q, k, v)
    assert (uncapped - out).abs().max() > 1e-2


def test_varlen_by_splitting():
    lengths_q, lengths_k = [3, 1, 5], [4, 6, 2]
    q = torch.randn(sum(lengths_q), 4, 8)
    k = torch.randn(sum(lengths_k), 2, 8)
    v = torch.randn(sum(lengths_k), 2, 8)
    cu_q = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 10, 12], dtype=torch.int32)
    out, lse = attention_ref_varlen(q, k, v, cu_q, cu_k, causal=True)
    assert out.shape == (9, 4, 8) and lse.shape == (4, 9)
    for i in range(3):
        qs, ks = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        o, l = attention_ref(q[qs][None], k[ks][None], v[ks][None], causal=True)
        assert torch.equal(out[qs], o[0]) and torch.equal(lse[:, qs], l[0])


def test_low_precision_path_really_is_low_precision():
    q, k, v = _inputs(2, 16, 24, 2, 2, 32, dtype=torch.bfloat16, seed=5)
    ref, lse_ref = attention_ref(q, k, v)
    low, lse_low = attention_ref(q, k, v, upcast=False)
    assert ref.dtype == torch.float32 and low.dtype == torch.bfloat16 and lse_low.dtype == torch.float32
    err = (low.float() - ref).abs().max().item()
    assert 0 < err < 5e-2
    assert (lse_low - lse_ref).abs().max().item() > 0


def test_tolerance_rule_passes_a_good_kernel_and_fails_bad_ones():
    q, k, v = _inputs(2, 33, 47, 4, 2, 32, dtype=torch.bfloat16, seed=6)
    ref, lse_ref = attention_ref(q, k, v, causal=True)
    low, lse_low = attention_ref(q, k, v, causal=True, upcast=False)
    good = ref.to(torch.bfloat16)  # a kernel exact up to output rounding
    report = assert_fa_close(good, ref, low)
    assert report.error <= report.bound

    bad = good.clone()
    bad[1, 20, 3, 5] += 0.05
    assert not fa_tolerance_report(bad, ref, low).ok
    with pytest.raises(AssertionError, match="out: max error"):
        assert_fa_close(bad, ref, low)

    nan = good.clone()
    nan[0, 0, 0, 0] = float("nan")
    assert fa_tolerance_report(nan, ref, low).nan_count == 1
    with pytest.raises(AssertionError, match="NaNs 1"):
        assert_fa_close(nan, ref, low)


def test_tolerance_rule_on_lse_checks_infinities():
    q, k, v = _inputs(1, 6, 3, 2, 2, 16, dtype=torch.bfloat16, seed=7)
    _, lse_ref = attention_ref(q, k, v, causal=True)
    _, lse_low = attention_ref(q, k, v, causal=True, upcast=False)
    assert torch.isneginf(lse_ref).any()
    assert_fa_close(lse_ref.clone(), lse_ref, lse_low, name="lse", atol=1e-4)
    finite_where_inf = torch.where(torch.isneginf(lse_ref), torch.zeros_like(lse_ref), lse_ref)
    report = fa_tolerance_report(finite_where_inf, lse_ref, lse_low, name="lse", atol=1e-4)
    assert report.mismatched_infinities == int(torch.isneginf(lse_ref).sum()) and not report.ok
    with pytest.raises(AssertionError, match="shapes differ"):
        assert_fa_close(lse_ref[:, :1], lse_ref, lse_low)


@pytest.mark.parametrize("sq, sk, hq, hk, causal, scale", [(7, 7, 2, 2, True, None), (5, 13, 4, 1, True, None),
                                                           (13, 5, 6, 3, True, 0.3), (9, 11, 4, 2, False, None)])
def test_sdpa_ref_is_torch_sdpa(sq, sk, hq, hk, causal, scale):
    """torch SDPA's semantics (top-left causal, GQA by repetition, scale) restated, against torch's math backend."""
    q, k, v = (t.transpose(1, 2) for t in _inputs(2, sq, sk, hq, hk, 16, seed=8))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(
            q.double(), k.double(), v.double(), is_causal=causal, scale=scale, enable_gqa=hq != hk
        )
    out = sdpa_ref(q, k, v, causal, scale)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)
    assert sdpa_ref(q.half(), k.half(), v.half(), causal, scale, upcast=False).dtype == torch.float16
