"""flash_attn_hopper.offsets: the KV-cache path's constants are made once and reused, and PackGQA's
scaled offsets of a constant are a constant too (so a decode step launches no small kernels)."""
from __future__ import annotations

import torch

from flash_attn_hopper import offsets


def test_constants_are_made_once_with_their_values():
    steps = offsets.constant("steps", 5, 7, "cpu")
    assert steps.dtype == torch.int32 and steps.tolist() == [0, 7, 14, 21, 28]
    assert offsets.constant("steps", 5, 7, torch.device("cpu")) is steps
    full = offsets.constant("full", 3, 4, "cpu")
    assert full.tolist() == [4, 4, 4] and offsets.constant("full", 3, 4, "cpu") is full
    assert offsets.constant("full", 3, 5, "cpu") is not full


def test_scaled_reuses_a_constant_and_multiplies_anything_else():
    steps = offsets.constant("steps", 4, 3, "cpu")
    scaled = offsets.scaled(steps, 8)
    assert scaled.tolist() == [0, 24, 48, 72] and scaled is offsets.constant("steps", 4, 24, "cpu")
    assert offsets.scaled(steps, 8) is scaled
    user = torch.tensor([0, 3, 6, 9], dtype=torch.int32)  # equal values, but not a kept constant
    got = offsets.scaled(user, 8)
    assert got.tolist() == [0, 24, 48, 72] and got is not scaled and user.tolist() == [0, 3, 6, 9]
