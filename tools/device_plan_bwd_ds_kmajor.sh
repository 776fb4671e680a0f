#!/bin/bash
# dS stored keys-contiguous with transposing stmatrix (FLASH_BWD_DEV_DS_KMAJOR=1, RS path, FA3's
# layout): a warp's four stores per step then sit whole swizzle periods apart, one base register
# plus immediates ([R12], [R12+0x800], ...), instead of four swizzled 64-bit addresses rebuilt
# every step. Local SASS (twentieth session), step loops, instructions (no spills anywhere):
#   hdim 128: non-causal 450 -> 421 (deterministic 447 -> 415), causal 532 -> 503 (deterministic
#             masked step 552 -> 523)
#   hdim 64:  non-causal 609 / 600 -> 561 / 552, causal masked / unmasked 1041 / 629 -> 774 / 580
#   with 80-query steps at hdim 128 (FLASH_BWD_DEV_M80=1 + LATE_P16=1): 479 per 80 queries (6.0 per
#             query; FA3 6.4, ours today 7.0), 4 LDL + 2 STL per step; without LATE_P16 568, no
#             spills (g2)
#   hdim 64 with FLASH_BWD_DEV_MASK_FORM=1 too (h2): causal masked steps 774 -> 712 (deterministic
#             795 -> 733), the rest as h1
# Prediction: +2-5 % at hdim 64 / 128 (more where the loop is issue-bound: hdim 64 causal).
# Measured (twenty-first session): hdim 128 +0.4-2 % (taken: now the default there; c0 forces
# the old layout);
# hdim 64 non-causal -2-3 %; the 80-query set (g0-g2) lost 1-7 % and its code
# (FLASH_BWD_DEV_M80) was removed after, so that set is gone from this plan.
# variants.py checks each variant's gradients first. 3 rounds against cuDNN at 1k / 8k,
# deterministic too. ~5 minutes (two sets).
#   run: bash tools/device_plan_bwd_ds_kmajor.sh      (carry .whl)
bash tools/device_variants_only.sh \
  "@200 --bwd --rounds 3 --seqlens 1024,8192 --deterministic --hdim 128 --variant c0:FLASH_BWD_DEV_DS_KMAJOR=0 --variant c1" \
  "@240 --bwd --rounds 3 --seqlens 1024,8192 --deterministic --hdim 64 --variant h0 --variant h1:FLASH_BWD_DEV_DS_KMAJOR=1 \
   --variant h2:FLASH_BWD_DEV_DS_KMAJOR=1,FLASH_BWD_DEV_MASK_FORM=1"
