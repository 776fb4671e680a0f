"""flash_attn_combine's Python side without a GPU: argument checks before any op, the op's schema
and fake kernel (shapes, dtypes, the LSE's layout), and the reference maths the GPU test holds the
kernel to (tests/test_combine_gpu.py)."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import flash_attn_hopper
from flash_attn_hopper import combine

from helpers.kernels import needs_extension


def combine_ref(out_partial, lse_partial):
    """The contract in float32: lse = logsumexp over splits, out = sum_s exp(l_s - lse) O_s, rows
    whose splits are all -inf give 0 and -inf."""
    lse = torch.logsumexp(lse_partial, dim=0)
    w = torch.exp(lse_partial - lse)
    w = torch.where(torch.isfinite(w), w, torch.zeros_like(w))
    return (w.unsqueeze(-1) * out_partial).sum(0), lse


def test_reference_is_attention_split_over_keys():
    """Splitting the keys of one attention into parts and combining the parts' (out, lse) with the
    reference gives the unsplit attention: the contract is the split-KV one."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 3, 16, generator=g) for _ in range(3))
    k, v = torch.randn(2, 24, 3, 16, generator=g), torch.randn(2, 24, 3, 16, generator=g)

    def attend(k, v):
        s = torch.einsum("bqhd,bkhd->bqhk", q, k) / 4
        return torch.einsum("bqhk,bkhd->bqhd", s.softmax(-1), v), torch.logsumexp(s, -1)

    whole, whole_lse = attend(k, v)
    parts = [attend(k[:, i:i + 8], v[:, i:i + 8]) for i in (0, 8, 16)]
    out, lse = combine_ref(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]))
    assert torch.allclose(out, whole, atol=1e-5) and torch.allclose(lse, whole_lse, atol=1e-5)
    empty = torch.full((3, 2, 5, 3), float("-inf"))
    out, lse = combine_ref(torch.stack([p[0] for p in parts]), empty)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


@pytest.mark.parametrize("change, error, fragment", [
    (dict(out_partial=torch.zeros(2, 1, 3, 4, 8, dtype=torch.float16)), ValueError, "out_partial must be float32"),
    (dict(lse_partial=torch.zeros(2, 1, 3, 5)), ValueError, "lse_partial (num_splits, batch, seqlen, nheads)"),
    (dict(out_partial=torch.zeros(0, 1, 3, 4, 8), lse_partial=torch.zeros(0, 1, 3, 4)), ValueError,
     "num_splits must be in [1, 256]"),
    (dict(out_dtype=torch.float64), ValueError, "out_dtype must be one of"),
    (dict(out=torch.zeros(1, 3, 4, 7)), ValueError, "out must be a tensor of shape (1, 3, 4, 8)"),
    (dict(out_partial=[0.0]), TypeError, "out_partial must be a torch.Tensor"),
    (dict(), ValueError, "must be CUDA tensors"),
])
def test_bad_arguments_are_refused_before_any_op(change, error, fragment):
    call = dict(out_partial=torch.zeros(2, 1, 3, 4, 8), lse_partial=torch.zeros(2, 1, 3, 4))
    call.update(change)
    with pytest.raises(error) as info:
        flash_attn_hopper.flash_attn_combine(**call)
    assert fragment in str(info.value)


@needs_extension("the fwd_combine op is defined by the compiled extension")
def test_schema_and_fake_kernel():
    op = torch.ops.flash_attn_hopper.fwd_combine.default
    assert str(op._schema) == str(torch._C.parse_schema(f"flash_attn_hopper::{combine.COMBINE_SCHEMA}"))
    assert tuple(a.name for a in op._schema.arguments) == combine.COMBINE_SCHEMA_ARGS
    with FakeTensorMode():
        o = torch.empty(3, 2, 5, 4, 64, device="cuda")
        l = torch.empty(3, 2, 5, 4, device="cuda")
        out, lse = op(o, l, torch.bfloat16)
        assert out.shape == (2, 5, 4, 64) and out.dtype == torch.bfloat16
        assert lse.shape == (2, 5, 4) and lse.dtype == torch.float32 and lse.stride() == (20, 1, 5)
        out, _ = op(o, l)
        assert out.dtype == torch.float32


@pytest.mark.parametrize("bad", [-1, 2.0, True, "3"])
def test_bad_num_splits_are_refused_before_any_op(bad):
    q = torch.zeros(1, 8, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="num_splits must be an int >= 0"):
        flash_attn_hopper.flash_attn_func(q, q, q, num_splits=bad)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="num_splits must be an int >= 0"):
        flash_attn_hopper.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8, num_splits=bad)


@needs_extension("the ops' schemas come with the compiled extension")
def test_num_splits_reaches_the_op_and_one_is_left_out(monkeypatch):
    from op_emulator import emulated_kernels, emulated_varlen_ops

    q = torch.randn(1, 8, 2, 64, dtype=torch.float16)
    with emulated_kernels(monkeypatch) as (fwd, _):
        flash_attn_hopper.flash_attn_func(q, q, q)
        flash_attn_hopper.flash_attn_func(q, q, q, num_splits=0)
        flash_attn_hopper.flash_attn_func(q, q, q, num_splits=5)
        flash_attn_hopper.flash_attn_func(q, q, q, num_splits=3, learnable_sink=torch.zeros(2))
    assert fwd.splits == [1, 0, 5, 3]
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with emulated_varlen_ops(monkeypatch) as (vfwd, _):
        flash_attn_hopper.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8, num_splits=3)
    assert vfwd.calls[0]["num_splits"] == 3
