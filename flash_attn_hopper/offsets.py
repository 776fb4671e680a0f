"""Small int32 tensors a KV-cache step passes to the kernels (constant lengths, evenly spaced
sequence offsets), made once per device and reused: a decode step then launches nothing but the
attention kernels, eagerly or in a CUDA graph captured on any stream.

The first time (outside a capture) a constant is made on the host and copied with a blocking copy,
so its contents are complete for every stream, and a later capture on another stream records no
kernel for it. Inside a capture a missing constant is made on the capturing stream and not kept
(its contents exist only at replay). Kept constants live as long as the process (another stream
may still read one), at most _MAX of them; past that each call makes its own.
"""
from __future__ import annotations

import torch

_MAX = 256
_CONSTANTS: dict = {}  # (kind, n, value, device) -> tensor
_KEY_OF: dict = {}  # id(tensor) -> its key above


def constant(kind: str, n: int, value: int, device) -> torch.Tensor:
    """int32 (n,) filled with value ("full") or the multiples 0, value, 2 value, ... ("steps")."""
    device = torch.device(device)
    key = (kind, n, value, device)
    t = _CONSTANTS.get(key)
    if t is not None:
        return t
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing() or len(_CONSTANTS) >= _MAX:
        # Ordered on the current stream like the call's other tensors.
        return _make(kind, n, value, device)
    t = _make(kind, n, value, torch.device("cpu")).to(device)  # a blocking copy: complete on return
    _CONSTANTS[key] = t
    _KEY_OF[id(t)] = key
    return t


def scaled(t: torch.Tensor, factor: int) -> torch.Tensor:
    """t * factor, a kept constant itself when t is one (PackGQA's row offsets at decode)."""
    key = _KEY_OF.get(id(t))
    if key is not None and _CONSTANTS.get(key) is t:
        kind, n, value, device = key
        return constant(kind, n, value * factor, device)
    return t * factor


def _make(kind: str, n: int, value: int, device: torch.device) -> torch.Tensor:
    if kind == "full":
        return torch.full((n,), value, dtype=torch.int32, device=device)
    return torch.arange(n, dtype=torch.int32, device=device) * value
