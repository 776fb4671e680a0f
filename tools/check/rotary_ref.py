"""Rotary embedding in plain torch, with flash_attn.layers.rotary's `apply_rotary_emb` signature.

tools/check/fa3_upstream.py installs this as `flash_attn.layers.rotary` beside FA3's test files,
whose kvcache tests rotate their reference q / k with it. Token s of sequence b sits at position
s + seqlen_offsets[b]; the first 2 * cos.shape[-1] features rotate in pairs (i, i + half), or
(2i, 2i + 1) with interleaved=True; the rest pass through, as do positions past the table.
Computed in float32, returned in x's dtype, as FA's kernel does.
"""

from __future__ import annotations

import torch


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    """x (batch, seqlen, nheads, headdim), or (total, nheads, headdim) with cu_seqlens; cos / sin
    (seqlen_ro, rotary_dim / 2); seqlen_offsets an int or a (batch,) tensor."""
    if cu_seqlens is not None:  # packed rows: rotate each sequence on its own
        out = x if inplace else x.clone()
        offsets = seqlen_offsets if torch.is_tensor(seqlen_offsets) else None
        for b in range(cu_seqlens.numel() - 1):
            start, end = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
            offset = int(offsets[b]) if offsets is not None else int(seqlen_offsets)
            out[start:end] = apply_rotary_emb(x[None, start:end], cos, sin, interleaved, False, offset)[0]
        return out
    batch, seqlen = x.shape[0], x.shape[1]
    half = cos.shape[-1]
    if torch.is_tensor(seqlen_offsets):
        offsets = seqlen_offsets.to(device=x.device, dtype=torch.long).reshape(-1, 1)
    else:
        offsets = torch.full((batch, 1), int(seqlen_offsets), device=x.device, dtype=torch.long)
    positions = offsets + torch.arange(seqlen, device=x.device)  # (batch, seqlen)
    inside = (positions < cos.shape[0])[:, :, None, None]  # past the table: no rotation, as FA's kernel
    positions = positions.clamp(max=cos.shape[0] - 1)
    c = torch.where(inside, cos.float()[positions][:, :, None, :], 1.0)  # (batch, seqlen, 1, half)
    s = torch.where(inside, sin.float()[positions][:, :, None, :], 0.0)
    rot = x[..., : 2 * half].float()
    if interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)
    else:
        a, b = rot[..., :half], rot[..., half:]
        rotated = torch.cat((a * c - b * s, a * s + b * c), dim=-1)
    result = torch.cat((rotated.to(x.dtype), x[..., 2 * half:]), dim=-1)
    if inplace:
        x.copy_(result)
        return x
    return result
