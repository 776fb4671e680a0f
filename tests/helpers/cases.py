"""The case lists the test files share: awkward sequence-length pairs and the sweep grids.

A quick subset by default; issue 3's full grid with ``FLASH_ATTN_HOPPER_FULL_TESTS=1``.
"""

from __future__ import annotations

import torch

from conftest import FULL_TESTS

# --------------------------------------------------------------------------
# Sequence lengths
# --------------------------------------------------------------------------

#: The awkward (seqlen_q, seqlen_k) pairs: one query / one key, far more keys than queries and
#: the reverse (bottom-right causal rows that see no key), lengths one past a block, square
#: multiples of the tile, and the longest (4224 = 33 x 128).
SEQLEN_PAIRS = [
    (1, 1),
    (1, 239),
    (3, 799),
    (113, 203),
    (128, 217),
    (799, 3),
    (1024, 1024),
    (2048, 2049),
    (4224, 4224),
]

#: The forward sweep's pairs: all of them in the full run.
FWD_SEQLEN_PAIRS = SEQLEN_PAIRS if FULL_TESTS else [(1, 1), (1, 239), (113, 203), (799, 3), (1024, 1024)]

#: The backward sweep's pairs: all but the longest in the full run.
BWD_SEQLEN_PAIRS = (
    [p for p in SEQLEN_PAIRS if p != (4224, 4224)]
    if FULL_TESTS
    else [(1, 239), (3, 799), (113, 203), (799, 3), (1024, 1024)]
)

#: The pairs the local-window tests run (forward and backward).
WINDOW_SEQLEN_PAIRS = [(113, 203), (799, 3), (1024, 1024), (1, 239)]

# --------------------------------------------------------------------------
# The kernel sweeps' grid: head dims, GQA ratios, batch, dtypes
# --------------------------------------------------------------------------

HDIMS_FULL = [64, 72, 96, 128, 136, 192, 256]
HDIMS_QUICK = [64, 72, 128, 256]
GQA_FULL = [1, 2, 6]
GQA_QUICK = [1, 6]
BATCHES_FULL = [1, 4]
BATCHES_QUICK = [2]
DTYPES = [torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp16", "bf16"]
NHEADS_KV = 2

HDIMS = HDIMS_FULL if FULL_TESTS else HDIMS_QUICK
GQA = GQA_FULL if FULL_TESTS else GQA_QUICK
BATCHES = BATCHES_FULL if FULL_TESTS else BATCHES_QUICK

# --------------------------------------------------------------------------
# Masks and shapes both kernel directions run
# --------------------------------------------------------------------------

#: (left, right) local windows: the diagonal alone, both sides, one side unbounded, causal + left.
WINDOWS = [(0, 0), (17, 5), (64, -1), (-1, 33), (100, 0)]

#: ((batch, seqlen_q, heads_q), (batch, seqlen_k, heads_kv)) with an empty dimension.
EMPTY_SHAPES = [((0, 64, 4), (0, 64, 4)), ((2, 0, 4), (2, 64, 4)), ((2, 64, 4), (2, 0, 4))]

#: Non-contiguous (batch, seqlen, heads, head_dim) layouts with a unit last stride (helpers.inputs.qkv).
STRIDED_LAYOUTS = ["bhsd_transposed", "every_other_head", "batch_stride_gap"]
