"""flash_attn_combine on the GPU: the combine kernel against the float32 reference (FlashAttention-3's
rule: within 2x the output dtype's own rounding of the reference), over split counts, head dims
(aligned and not), row counts, output dtypes, non-contiguous partials, splits that saw no key, rows
that saw none, and the out= argument."""
from __future__ import annotations

import pytest
import torch

from flash_attn_hopper import flash_attn_combine

from test_combine_cpu import combine_ref

pytestmark = pytest.mark.gpu


def _partials(splits, batch, seqlen, heads, d, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    # Non-contiguous views, as split kernels' workspaces may be: heads before seqlen in memory,
    # and every other split.
    o = torch.randn(2 * splits, batch, heads, seqlen, d, device="cuda", generator=g).transpose(2, 3)[::2]
    lse = torch.randn(splits, batch, 2 * heads, seqlen, device="cuda", generator=g).transpose(-1, -2)[..., :heads]
    lse[splits // 2:, : max(1, batch // 3)] = float("-inf")  # splits that saw no key
    return o, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("d", [64, 111, 128, 256, 512])
@pytest.mark.parametrize("seqlen", [1, 3, 113, 640])
@pytest.mark.parametrize("splits", [1, 2, 5, 55, 133])
def test_against_the_reference(splits, seqlen, d, dtype):
    o, lse_p = _partials(splits, 4, seqlen, 6, d, seed=splits * seqlen + d)
    out, lse = flash_attn_combine(o, lse_p, out_dtype=dtype)
    ref, lse_ref = combine_ref(o, lse_p)
    assert out.shape == ref.shape and out.dtype == dtype and lse.shape == lse_ref.shape
    assert torch.allclose(lse, lse_ref, atol=1e-5, rtol=1e-5)
    rounding = (ref.to(dtype).float() - ref).abs().max().item()
    assert (out.float() - ref).abs().max().item() <= 2 * rounding + 1e-5


def test_rows_without_any_key_and_the_out_argument():
    o, lse_p = _partials(3, 2, 17, 4, 64, seed=1)
    lse_p[:, 1, 5] = float("-inf")  # one row (batch 1, position 5) saw no key in any split
    o[:, 1, 5] = float("nan")  # never read: its weight is 0
    out = torch.full((2, 17, 4, 64), float("nan"), device="cuda", dtype=torch.bfloat16)
    got, lse = flash_attn_combine(o, lse_p, out=out)
    assert got is out and out.dtype == torch.bfloat16
    assert torch.equal(out[1, 5].float(), torch.zeros(4, 64, device="cuda")) and torch.isneginf(lse[1, 5]).all()
    assert not out.isnan().any()


@pytest.mark.parametrize("splits,batch,seqlen", [(17, 3, 200), (133, 1, 1)], ids=["warp-per-row", "block-per-row"])
def test_bitwise_repeatable(splits, batch, seqlen):
    o, lse_p = _partials(splits, batch, seqlen, 8, 128, seed=2)
    first = flash_attn_combine(o, lse_p, out_dtype=torch.bfloat16)
    for _ in range(5):
        again = flash_attn_combine(o, lse_p, out_dtype=torch.bfloat16)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
