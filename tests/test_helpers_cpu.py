"""The shared test helpers checked on the CPU: the input factory gives the layouts it names,
and the gradient assertion passes right gradients and fails wrong ones."""

from __future__ import annotations

import pytest
import torch

from helpers.cases import BWD_SEQLEN_PAIRS, FWD_SEQLEN_PAIRS, SEQLEN_PAIRS, WINDOW_SEQLEN_PAIRS
from helpers.grads import EMULATION_REL_NORM, assert_grads_close, check_grads, reference_grads
from helpers.inputs import LAYOUTS, qkv
from reference import attention_ref, sdpa_ref


@pytest.mark.parametrize("heads_first", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_qkv_layouts(layout, heads_first):
    b, s, hq, hk, d = 2, 19, 6, 2, 16
    q, k, v, dout = qkv(b, s, s, hq, hk, d, dtype=torch.float16, device="cpu", seed=3, layout=layout,
                        heads_first=heads_first, dout=True)
    shape = (lambda h: (b, h, s, d)) if heads_first else (lambda h: (b, s, h, d))
    assert [t.shape for t in (q, k, v, dout)] == [shape(hq), shape(hk), shape(hk), shape(hq)]
    assert all(t.dtype == torch.float16 and t.stride(-1) == 1 for t in (q, k, v, dout))
    contiguous = layout == "contiguous" or layout == ("bhsd_memory" if heads_first else "bshd_memory")
    assert q.is_contiguous() is contiguous, (layout, q.stride())
    again = qkv(b, s, s, hq, hk, d, dtype=torch.float16, device="cpu", seed=3, layout=layout,
                heads_first=heads_first, dout=True)
    assert all(torch.equal(a, c) for a, c in zip((q, k, v, dout), again)), "the same seed drew other values"
    assert not torch.equal(q, qkv(b, s, s, hq, hk, d, dtype=torch.float16, device="cpu", seed=4, layout=layout,
                                  heads_first=heads_first)[0])


def test_qkv_options():
    q, k, v = qkv(2, 5, 7, 4, 2, 16, dv=8, dtype=torch.bfloat16, device="cpu", requires_grad=True)
    assert (q.shape, k.shape, v.shape) == ((2, 5, 4, 16), (2, 7, 2, 16), (2, 7, 2, 8))
    assert all(t.is_leaf and t.requires_grad for t in (q, k, v))
    # One generator per tensor: k drawn alone from seed + 1.
    _, k1, _ = qkv(1, 4, 4, 2, 2, 8, dtype=torch.float32, device="cpu", seed=10, seed_per_tensor=True)
    assert torch.equal(k1, torch.randn(1, 4, 2, 8, generator=torch.Generator().manual_seed(11)))
    # Drawn in float32 and rounded.
    q16, *_ = qkv(1, 300, 4, 2, 2, 64, dtype=torch.float16, device="cpu", seed=1, draw_dtype=torch.float32)
    assert torch.equal(q16, torch.randn(1, 300, 2, 64, generator=torch.Generator().manual_seed(1)).half())
    with pytest.raises(ValueError, match="packed"):
        qkv(1, 4, 5, 2, 2, 8, device="cpu", layout="packed")


def test_seqlen_pairs_are_one_list():
    assert set(FWD_SEQLEN_PAIRS) <= set(SEQLEN_PAIRS) and set(BWD_SEQLEN_PAIRS) <= set(SEQLEN_PAIRS)
    assert set(WINDOW_SEQLEN_PAIRS) <= set(SEQLEN_PAIRS)


def _grads(causal=True):
    q, k, v, dout = qkv(2, 37, 53, 6, 2, 32, dtype=torch.float16, device="cpu", seed=2, dout=True,
                        draw_dtype=torch.float32)
    exact = [g.half() for g in reference_grads(q, k, v, dout, causal=causal)]  # right up to output rounding
    return exact, (q, k, v, dout)


def test_check_grads_passes_right_gradients():
    grads, inputs = _grads()
    check_grads(grads, *inputs, causal=True)
    check_grads(grads, *inputs, max_rel_norm=EMULATION_REL_NORM, causal=True)


@pytest.mark.parametrize("wrong", ["scaled", "one_entry", "nan", "other_mask", "dtype"])
def test_check_grads_fails_wrong_gradients(wrong):
    grads, inputs = _grads()
    dq, dk, dv = grads
    if wrong == "scaled":
        dk = dk * 1.01
    elif wrong == "one_entry":
        dv = dv.clone()
        dv[1, 20, 1, 5] += 0.05
    elif wrong == "nan":
        dq = dq.clone()
        dq[0, 0, 0, 0] = float("nan")
    elif wrong == "other_mask":
        dq, dk, dv = _grads(causal=False)[0]
    else:
        dq = dq.float()
    with pytest.raises(AssertionError):
        check_grads((dq, dk, dv), *inputs, causal=True)


def test_assert_grads_close_needs_a_criterion_and_checks_shapes():
    grads, (q, k, v, dout) = _grads()
    ref = reference_grads(q, k, v, dout, causal=True)
    with pytest.raises(ValueError):
        assert_grads_close(grads, ref)
    assert_grads_close(grads, ref, max_rel_norm=EMULATION_REL_NORM)
    with pytest.raises(AssertionError, match="shape"):
        assert_grads_close([grads[0][:, 1:], *grads[1:]], ref, max_rel_norm=1.0)


def test_reference_grads_takes_any_reference():
    q, k, v, dout = qkv(1, 9, 9, 2, 2, 16, dtype=torch.float32, device="cpu", seed=5, dout=True)
    # sdpa_ref (top-left, heads first) and attention_ref (bottom-right, seqlen first) agree on square causal.
    by_sdpa = reference_grads(*(t.transpose(1, 2) for t in (q, k, v, dout)), attention=sdpa_ref, is_causal=True)
    by_ref = reference_grads(q, k, v, dout, causal=True)
    for a, b in zip(by_sdpa, by_ref):
        torch.testing.assert_close(a.transpose(1, 2), b)
    low = reference_grads(q.half(), k.half(), v.half(), dout.half(), upcast=False, causal=True)
    assert all(g.dtype == torch.float16 for g in low)
    def doubled_ref(q, k, v, upcast):
        return attention_ref(q, k, v, upcast=upcast)[0] * 2

    doubled = reference_grads(q, k, v, dout, attention=doubled_ref)
    plain = reference_grads(q, k, v, dout)
    for a, b in zip(doubled, plain):
        torch.testing.assert_close(a, 2 * b)
