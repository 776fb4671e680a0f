"""The (head dim, GQA ratio, batch, dtype) grid of the kernel sweeps in test_flash_fwd.py and
test_flash_bwd.py: a quick subset by default, issue 3's full grid with
``FLASH_ATTN_HOPPER_FULL_TESTS=1``. The sequence-length pairs stay with each test file.
"""

from __future__ import annotations

import torch

from conftest import FULL_TESTS

HDIMS_FULL = [64, 72, 96, 128, 136, 192, 256]
HDIMS_QUICK = [64, 72, 128, 256]
GQA_FULL = [1, 2, 6]
GQA_QUICK = [1, 6]
BATCHES_FULL = [1, 4]
BATCHES_QUICK = [2]
DTYPES = [torch.float16, torch.bfloat16]
NHEADS_KV = 2

HDIMS = HDIMS_FULL if FULL_TESTS else HDIMS_QUICK
GQA = GQA_FULL if FULL_TESTS else GQA_QUICK
BATCHES = BATCHES_FULL if FULL_TESTS else BATCHES_QUICK
