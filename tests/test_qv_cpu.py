"""FA3's ``qv`` without a GPU: what flash_attn_func / flash_attn_varlen_func refuse before any
launch, that valid calls get as far as the device check, and the qv ops' fake kernels."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from flash_attn_hopper import _build_info, flash_attn_func, flash_attn_varlen_func, manifest

BF16 = torch.bfloat16


@pytest.fixture
def everything_compiled(monkeypatch):
    monkeypatch.setattr(_build_info, "COMPILED", frozenset(manifest.full_selection().instantiations()))


def dense(b=2, sq=3, sk=40, hq=16, hk=1, d=64, dv=512, dtype=BF16, device="cpu"):
    q = torch.randn(b, sq, hq, d, dtype=dtype, device=device)
    k = torch.randn(b, sk, hk, d, dtype=dtype, device=device)
    v = torch.randn(b, sk, hk, dv, dtype=dtype, device=device)
    qv = torch.randn(b, sq, hq, dv, dtype=dtype, device=device)
    return q, k, v, qv


def packed(dv=512, d=64):
    q, k, v, qv = dense(b=1, sq=7, sk=30, d=d, dv=dv)
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 10, 30], dtype=torch.int32)
    return dict(q=q[0], k=k[0], v=v[0], qv=qv[0], cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=4,
                max_seqlen_k=20)


@pytest.mark.parametrize("dv", [512, 256, 72, 328])
def test_valid_calls_reach_the_device_check(dv, everything_compiled):
    """Also with inputs that require grad (FA3 runs the forward; only the backward is refused)."""
    q, k, v, qv = dense(dv=dv)
    with pytest.raises(ValueError, match="on cpu"):
        flash_attn_func(q, k, v.requires_grad_(), qv=qv.requires_grad_(), causal=True)
    with pytest.raises(ValueError, match="on cpu"):
        flash_attn_varlen_func(**packed(dv))


def test_a_build_without_the_qv_kernels_names_the_knob(monkeypatch):
    only_fwd = frozenset({manifest.Instantiation("fwd", 64, "bf16")})
    monkeypatch.setattr(_build_info, "COMPILED", only_fwd)
    q, k, v, qv = dense()
    with pytest.raises(RuntimeError, match="without qv forward kernels.*FLASH_ATTN_HOPPER_HDIMS=64"):
        flash_attn_func(q, k, v, qv=qv)


BAD = {
    # id: (change to the valid dense call, exception, fragment)
    "hdim_128": (dict(d=128), ValueError, "up to 64"),
    "hdim_60": (dict(d=60), ValueError, "multiple of 8"),
    "dv_64": (dict(dv=64), ValueError, "(64, 512]"),
    "dv_640": (dict(dv=640), ValueError, "(64, 512]"),
    "dv_260": (dict(dv=260), ValueError, "(64, 512]"),
}


@pytest.mark.parametrize("case", BAD)
def test_head_dims_the_kernels_do_not_take_are_refused(case):
    change, error, fragment = BAD[case]
    q, k, v, qv = dense(**change)
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace("]", r"\]")):
        flash_attn_func(q, k, v, qv=qv)


def test_qv_shape_dtype_stride_and_features_are_checked():
    q, k, v, qv = dense()
    with pytest.raises(ValueError, match="q's shape with v's head dim"):
        flash_attn_func(q, k, v, qv=qv[:, :2])
    with pytest.raises(ValueError, match="4-D"):
        flash_attn_func(q, k, v, qv=torch.zeros(1))
    with pytest.raises(TypeError, match="qv must be a torch.Tensor"):
        flash_attn_func(q, k, v, qv=[1.0])
    with pytest.raises(ValueError, match="q's dtype"):
        flash_attn_func(q, k, v, qv=qv.half())
    with pytest.raises(ValueError, match="contiguous"):
        flash_attn_func(q, k, v, qv=qv.transpose(-1, -2).contiguous().transpose(-1, -2))
    call = packed()
    pages = dict(k=torch.zeros(4, 16, 1, 64, dtype=BF16), v=torch.zeros(4, 16, 1, 512, dtype=BF16))
    with pytest.raises(ValueError, match="seqused_k"):  # a paged cache (vLLM's MLA call) needs the lengths
        flash_attn_varlen_func(**{**call, **pages}, page_table=torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="4-D"):
        flash_attn_varlen_func(**call, page_table=torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="3-D"):
        call = packed()
        call["qv"] = call["qv"].unsqueeze(0)
        flash_attn_varlen_func(**call)


def test_default_scale_is_fa3s(monkeypatch, everything_compiled):
    """FA3's default softmax scale with qv: (headdim + headdim_v) ** -0.5, passed to the op."""
    from flash_attn_hopper import qv as qv_calls

    seen = {}

    class Op:
        def __call__(self, *args, **kwargs):
            seen["scale"] = args[4]
            raise RuntimeError("stop")

    monkeypatch.setattr(qv_calls.ops, "op_of_build", lambda name, feature: Op())
    monkeypatch.setattr(qv_calls.support, "check", lambda *a, **kw: _Answer())
    q, k, v, qv = dense(dv=448)
    with pytest.raises(RuntimeError, match="stop"):
        flash_attn_func(q, k, v, qv=qv)
    assert seen["scale"] == pytest.approx((64 + 448) ** -0.5)


class _Answer:
    window = None
    causal = False


@pytest.mark.skipif(not hasattr(torch.ops.flash_attn_hopper, "fwd_qv"), reason="the installed build predates the qv ops")
def test_fake_kernels_give_the_output_shapes():
    with FakeTensorMode():
        q, k, v, qv = dense(b=2, sq=5, sk=9, hq=8, hk=1, dv=512, device="cuda")
        out, lse = torch.ops.flash_attn_hopper.fwd_qv(q, k, v, qv, 0.05, False)
        assert out.shape == (2, 5, 8, 512) and lse.shape == (2, 8, 5) and lse.dtype == torch.float32
        cu = torch.zeros(3, dtype=torch.int32, device="cuda")
        out, lse = torch.ops.flash_attn_hopper.varlen_fwd_qv(q[0], k[0], v[0], qv[0], cu, cu, None, None, 5, 9,
                                                            0.05, False)
        assert out.shape == (5, 8, 512) and lse.shape == (8, 5)
        if hasattr(torch.ops.flash_attn_hopper, "paged_fwd_qv"):
            pages_k = torch.empty(6, 16, 1, 64, dtype=BF16, device="cuda")
            pages_v = torch.empty(6, 16, 1, 512, dtype=BF16, device="cuda")
            table = torch.zeros(2, 3, dtype=torch.int32, device="cuda")
            used = torch.zeros(2, dtype=torch.int32, device="cuda")
            out, lse = torch.ops.flash_attn_hopper.paged_fwd_qv(q[0], pages_k, pages_v, qv[0], table, cu, cu, used,
                                                               5, 48, 0.05, True)
            assert out.shape == (5, 8, 512) and lse.shape == (8, 5)
