#!/bin/bash
# Variants only, ~5 minutes. Forward at short lengths, where a tile has one to sixteen key blocks
# and the hand-over between tiles shows. Run in the fourteenth session (2026-11-30, NOTES) on
# branch exp/fwd-lazy-store, where both switches were off by default; both are on since, so the
# variants below turn them off instead (off = the old kernels).
#  ls: FLASH_FWD_DEV_LAZY_STORE (own-O persistent kernels): the O store's read of shared memory
#      awaited before the next tile's O is written, not right after the store is issued.
#  q2: FLASH_FWD_DEV_Q2 (own-O persistent kernels): a second Q buffer, so the next tile's Q
#      loads while this tile still reads its own.
#  p256: FLASH_FWD_PERSISTENT=1 at hdim 256: every class persistent (the table now has causal
#      below 1k keys persistent).
# (The run also had rs128, FLASH_FWD_DEV_RANGE_SHIFT=1: nothing; the switch is gone.)
# Measured x cuDNN, causal 512 / 1k / 2k, hdim 64: off 0.936 / 0.973 / 0.986, ls 0.960 / 1.004 /
# 1.001, q2 0.946 / 0.986 / 1.007, both 0.956 / 0.981 / 0.993; non-causal off 0.989 / 1.022 /
# 1.125, both 1.034 / 1.060 / 1.163; hdim 128 causal equal; hdim 256 causal (p256) 0.951 / 1.007
# / 1.043 -> 0.995 / 1.020 / 1.021.
# Checks: variants.py's shapes, with 6000 x 300 keys (564 short tiles: many hand-overs per CTA).
#   run: bash tools/device_plan_fwd_short.sh      (carry .whl)
OFF=FLASH_FWD_DEV_LAZY_STORE=0,FLASH_FWD_DEV_Q2=0
bash tools/device_variants_only.sh \
  "@150 --hdim 64 --rounds 3 --causal 1,0 --seqlens 512,1024,2048 --variant off64:$OFF --variant ls64:FLASH_FWD_DEV_Q2=0 --variant q2_64:FLASH_FWD_DEV_LAZY_STORE=0 --variant both64" \
  "@150 --hdim 128 --rounds 3 --causal 1 --seqlens 512,1024,2048 --variant off128:$OFF --variant both128" \
  "@110 --hdim 256 --rounds 3 --causal 1 --seqlens 512,1024,2048 --variant b256 --variant p256:FLASH_FWD_PERSISTENT=1"
