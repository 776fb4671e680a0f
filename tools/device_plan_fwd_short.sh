#!/bin/bash
# Branch exp/fwd-lazy-store, variants only, ~5 minutes. Forward at short lengths, where a tile
# has one to sixteen key blocks and the hand-over between tiles shows.
#  ls: FLASH_FWD_DEV_LAZY_STORE=1 (own-O persistent kernels): the O store's read of shared memory
#      awaited before the next tile's O is written, not right after the store is issued.
#  q2: FLASH_FWD_DEV_Q2=1 (own-O persistent kernels): a second Q buffer, so the next tile's Q
#      loads while this tile still reads its own.
#  p256: FLASH_FWD_PERSISTENT=1 at hdim 256: causal runs persistent, tiles from the counter
#      (O in Q's buffer), instead of one CTA per tile.
#  rs: FLASH_FWD_DEV_RANGE_SHIFT=1 (NOTES item 5).
# Predictions x cuDNN, causal 512 / 1k / 2k: ls +1-3 % at 512, +0-1 % at 2k; q2 +2-4 % at 512,
# +1 % at 2k; both together about the sum; p256 +3-6 % at 512 (like hdim 128's causal
# persistent), less at 2k; rs +0-1 %. hdim 64 non-causal 512 (192x128, own O): ls / q2 +1-2 %.
# Checks: variants.py's shapes, now with 6000 x 300 keys (564 short tiles: many hand-overs per CTA).
#   run: bash tools/device_plan_fwd_short.sh      (carry .whl)
L=FLASH_FWD_DEV_LAZY_STORE=1
Q=FLASH_FWD_DEV_Q2=1
bash tools/device_variants_only.sh \
  "@150 --hdim 64 --rounds 3 --causal 1,0 --seqlens 512,1024,2048 --variant b64 --variant ls64:$L --variant q2_64:$Q --variant lq64:$L,$Q" \
  "@150 --hdim 128 --rounds 3 --causal 1 --seqlens 512,1024,2048 --variant b128 --variant ls128:$L --variant q2_128:$Q --variant lq128:$L,$Q --variant rs128:FLASH_FWD_DEV_RANGE_SHIFT=1" \
  "@110 --hdim 256 --rounds 3 --causal 1 --seqlens 512,1024,2048 --variant b256 --variant p256:FLASH_FWD_PERSISTENT=1"
