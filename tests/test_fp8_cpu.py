"""The FP8 forward's Python layer without a GPU: the build knob, the routing of float8_e4m3fn
inputs, and the refusals that come before any launch (tests/test_fp8_gpu.py runs the kernels)."""

from __future__ import annotations

import pytest
import torch

from flash_attn_hopper import flash_attn_func, flash_attn_varlen_func, fp8, manifest, packgqa

FP8 = torch.float8_e4m3fn


def qkv(head_dim=128, batch=2, seqlen=64, heads=4, heads_kv=2, dtype=FP8):
    q = torch.randn(batch, seqlen, heads, head_dim).to(dtype)
    k = torch.randn(batch, seqlen, heads_kv, head_dim).to(dtype)
    return q, k, k.clone()


def test_the_dtype_knob_selects_the_fp8_kernels():
    sel = manifest.selection_from_env({manifest.ENV_DTYPES: "bf16,fp8", manifest.ENV_HDIMS: "128,192"})
    files = {i.filename for i in sel.instantiations()}
    assert "flash_fp8_hdim128_fp8_sm90.cu" in files  # the FP8 direction takes hdims 64 / 128 / 256 only
    assert not any("fp8" in f and "192" in f for f in files)
    assert not any(i.dtype == "fp8" and i.direction != "fp8" for i in sel.instantiations())
    assert not any(i.direction == "fp8" for i in manifest.selection_from_env({manifest.ENV_DTYPES: "bf16"}).instantiations())
    assert manifest.parse_dtypes("e4m3") == ("fp8",)
    assert "fp8" in manifest.parse_dtypes(None)  # a default build has them
    assert manifest.Instantiation("fp8", 64, "fp8").cutlass_type == "cutlass::float_e4m3_t"


@pytest.mark.parametrize("head_dim, kernel", [(16, 64), (64, 64), (80, 128), (128, 128), (176, 256), (256, 256),
                                              (72, None), (264, None), (0, None)])
def test_head_dims_run_on_the_next_fp8_kernel(head_dim, kernel):
    assert fp8.kernel_head_dim(head_dim) == kernel


def test_mixed_dtypes_are_refused():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="q, k and v all in torch.float8_e4m3fn.*v torch.bfloat16"):
        flash_attn_func(q, k, v.to(torch.bfloat16))
    with pytest.raises(TypeError, match="all in torch.float8_e4m3fn"):
        flash_attn_func(q.to(torch.float16), k, v)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(qv=torch.randn(2, 64, 4, 128).to(FP8)), RuntimeError, "FP8 inputs with qv"),
    (dict(softcap=-1.0), ValueError, "softcap"),
    (dict(q_descale=torch.ones(2, 4)), ValueError, r"q_descale must be a float32 tensor of shape \(batch, nheads_kv\) = \(2, 2\)"),
    (dict(v_descale=torch.ones(2, 2, dtype=torch.float16)), ValueError, "v_descale must be a float32"),
    (dict(k_descale=1.0), ValueError, "k_descale must be a float32 tensor.*got float"),
    (dict(sm_margin=2), RuntimeError, "sm_margin=2"),
])
def test_what_the_fp8_kernels_do_not_take_is_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        flash_attn_func(*qkv(), **kwargs)


def test_head_dims_and_value_dims_the_fp8_kernels_do_not_take():
    with pytest.raises(ValueError, match="multiples of 16 up to 256, got 72"):
        flash_attn_func(*qkv(head_dim=72))
    q, k, _ = qkv()
    with pytest.raises(ValueError, match="one head dim for q, k and v"):
        flash_attn_func(q, k, torch.randn(2, 64, 2, 64).to(FP8))


def test_hints_and_gradients_pass_the_fp8_checks(monkeypatch):
    """num_splits / pack_gqa (hints the FP8 kernels do not take), softcap, attention_chunk and inputs
    that require grad (FA3's tests pass such; the backward raises) reach the device check."""
    monkeypatch.setattr(fp8, "_check_compiled", lambda head_dim: None)
    q, k, v = (t.float().requires_grad_() for t in qkv())
    q8 = q.to(FP8)  # a cast of a leaf that requires grad: q8 requires grad too
    assert q8.requires_grad
    for kwargs in (dict(num_splits=3, pack_gqa=True), dict(softcap=15.0), dict()):
        with pytest.raises(ValueError, match="are on cpu"):
            flash_attn_func(q8, k.detach().to(FP8), v.detach().to(FP8), **kwargs)


def test_varlen_fp8_checks_descales_per_sequence():
    q, k, v = (t.reshape(-1, *t.shape[2:]) for t in qkv())
    cu = torch.tensor([0, 50, 128], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"\(batch, nheads_kv\) = \(2, 2\)"):
        flash_attn_varlen_func(q, k, v, cu, cu, 78, 78, q_descale=torch.ones(3, 2))
    pages = torch.randn(6, 16, 2, 128).to(FP8)
    table = torch.zeros(2, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="k must be a 4-D tensor"):  # a page table takes (pages, rows, heads, d)
        flash_attn_varlen_func(q, k, v, cu, None, 78, 64, seqused_k=torch.tensor([3, 64], dtype=torch.int32),
                               page_table=table)
    with pytest.raises(ValueError, match="seqused_k"):
        flash_attn_varlen_func(q, pages, pages, cu, None, 78, 64, page_table=table)
    with pytest.raises(ValueError, match=r"k_descale must be .* \(2, 2\)"):
        flash_attn_varlen_func(q, pages, pages, cu, None, 78, 64, seqused_k=torch.tensor([3, 64], dtype=torch.int32),
                               page_table=table, k_descale=torch.ones(1, 2))


def test_a_valid_fp8_call_on_cpu_stops_at_the_device_check(monkeypatch):
    monkeypatch.setattr(fp8, "_check_compiled", lambda head_dim: None)
    with pytest.raises(ValueError, match="are on cpu"):
        flash_attn_func(*qkv(), q_descale=torch.ones(2, 2), causal=True)


def test_fp8_kv_caches_paged_and_contiguous_reach_the_device_check(monkeypatch):
    from flash_attn_hopper import flash_attn_with_kvcache

    q, k, v = qkv()
    lens = torch.tensor([64, 64], dtype=torch.int32)
    with pytest.raises(ValueError, match="q_descale applies to FP8|Pass FP8"):
        flash_attn_with_kvcache(*(t.to(torch.bfloat16) for t in (q, k, v)), cache_seqlens=lens,
                                q_descale=torch.ones(2, 2))
    monkeypatch.setattr(fp8, "_check_compiled", lambda head_dim: None)
    with pytest.raises(ValueError, match="are on cpu"):  # a contiguous FP8 cache with descales reaches the device check
        flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, k_descale=torch.ones(2, 2), causal=True)
    pages = torch.randn(6, 16, 2, 128).to(FP8)
    with pytest.raises(ValueError, match="are on cpu"):  # so does a paged one
        flash_attn_with_kvcache(q, pages, pages, cache_seqlens=lens, page_table=torch.zeros(2, 4, dtype=torch.int32),
                                v_descale=torch.ones(2, 2), causal=True)


def _recording_op(calls):
    """A stand-in for varlen_fwd_fp8 / paged_fwd_fp8 in packgqa.call_packed: records its arguments
    and returns each row's own bytes as out (so a wrong packing or unpacking shows) and a distinct
    LSE per (head, row)."""

    def call(rows, cu_q, max_q, causal, left, right, **kw):
        calls.append(dict(rows=rows, cu_q=cu_q, max_q=max_q, causal=causal, window=(left, right), kw=kw))
        heads, n = rows.shape[1], rows.shape[0]
        return rows.view(torch.uint8).float(), torch.arange(heads * n, dtype=torch.float32).view(heads, n)

    return call


def test_fp8_packgqa_packs_rows_and_unpacks_them():
    """Decode rows (one query per sequence, GQA 8:2): the query heads of a KV head become rows t * 4 + j
    of one head, with offsets x 4, no mask and the split hint passed on; out / the LSE come back per
    query head, by the op's combine (pack_gqa = 4) or, with softcap (no split kernels), here."""
    q = torch.randn(6, 8, 64).to(FP8)
    cu = torch.arange(7, dtype=torch.int32)
    calls = []
    out, lse = packgqa.call_packed(_recording_op(calls), q, 2, cu, 1, True, -1, 0, 5.0, None, None, 3, None, True)
    c = calls[-1]
    assert c["rows"].shape == (24, 2, 64) and c["max_q"] == 4 and not c["causal"] and c["window"] == (-1, -1)
    assert torch.equal(c["cu_q"], cu * 4) and c["kw"] == {"num_splits": 3}
    assert torch.equal(c["rows"].view(torch.uint8)[4 * 2 + 3, 1], q.view(torch.uint8)[2, 1 * 4 + 3])
    assert torch.equal(out, q.view(torch.uint8).float())  # back to (rows, query heads, d)
    assert lse.shape == (8, 6)
    assert lse[1 * 4 + 3, 2] == 1 * 24 + 2 * 4 + 3  # packed head 1, row 2 * 4 + 3
    # Without softcap the op's combine unpacks: pack_gqa = 4, out returned as the op gave it.
    out, _ = packgqa.call_packed(_recording_op(calls), q, 2, cu, 1, True, -1, 0, 0.0, None, None, 0, None, True)
    assert calls[-1]["kw"] == {"num_splits": 0, "pack_gqa": 4} and out.shape == (24, 2, 64)


@pytest.mark.parametrize("case", ["causal chunk", "pack_gqa=False", "sink", "seqused_q", "MHA"])
def test_fp8_packgqa_left_out_where_it_is_not_exact(case):
    """Causal chunks of several queries, pack_gqa=False, a learnable sink (per query head), seqused_q
    and MHA run unpacked: q as given, its mask, the split hint."""
    heads_k = 8 if case == "MHA" else 2
    q = torch.randn(10, 8, 64).to(FP8)
    cu = torch.tensor([0, 5, 10], dtype=torch.int32)
    max_q = 5 if case == "causal chunk" else 1
    cu = cu if case == "causal chunk" else torch.arange(11, dtype=torch.int32)
    calls = []
    packgqa.call_packed(_recording_op(calls), q, heads_k, cu, max_q, True, -1, 0, 0.0,
                        torch.zeros(8) if case == "sink" else None,
                        torch.ones(10, dtype=torch.int32) if case == "seqused_q" else None, 2,
                        False if case == "pack_gqa=False" else None, False)
    c = calls[-1]
    assert c["rows"] is q and c["causal"] and c["window"] == (-1, 0) and c["kw"] == {"num_splits": 2}
