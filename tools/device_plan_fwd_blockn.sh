#!/bin/bash
# Branch exp/fwd-blockn, variants only, ~4 minutes. hdim 128 non-causal long keys: 128x176
# (table) against 128x128 (own O, the mid-keys tile) where 176 leaves a partial last block.
#  n128:  FLASH_FWD_LONG_KEYS_FROM=2^30: 128x128 at every non-causal length.
#  w1000: FLASH_FWD_LONG_TILE_RATIO=1000 (tile_size.h, fwd_keys_class_for): the mid tile
#         wherever it pads fewer keys: here 4k, 8k, 12k, 16k take 128x128, 8448 and 10000 keep
#         128x176 (so each of its points repeats b128's or n128's kernel, through the new dispatch).
# Measured in the fourteenth session (tools/shape_probe.py): at 8192 the partial last block costs
# ~2.3 % (8192:2:33 688 against 8448:2:16 705 TFLOP/s).
# Prediction, n128 against b128: 8448 -2-4 % (both tiles whole there: the long tile's own
# advantage, r), 8192 +0-1 %, 4096 +1-3 % (176 wastes 128 of 4224 keys), 12288 -1-2 % (144 of
# 176 used), 16384 -1-3 %, 10000 -2-4 %. If n128 wins anywhere: set the ratio to the measured r
# (w at 1000 + 1000 * (r - 1)), default it, then tools/device_plan.sh.
# Ran 2026-11-30 (fifteenth session): n128 against b128 at 4096 / 8192 / 8448 / 10000 / 12288 /
# 16384: +2.7 / +2.0 / 0.0 / -0.8 / +2.1 / +2.0 %; w1000 675 / 693 / 702 / 674 / 700 / 698 TFLOP/s.
# The tiles tie on whole blocks (r = 1), so w1000 became the default (FLASH_FWD_LONG_TILE_RATIO).
#   run: bash tools/device_plan_fwd_blockn.sh      (carry .whl)
bash tools/device_variants_only.sh \
  "@200 --hdim 128 --rounds 3 --causal 0 --seqlens 4096,8192,8448,10000,12288,16384 --variant b128:FLASH_FWD_LONG_TILE_RATIO=0 --variant n128:FLASH_FWD_LONG_KEYS_FROM=1073741824 --variant w1000:FLASH_FWD_LONG_TILE_RATIO=1000"
