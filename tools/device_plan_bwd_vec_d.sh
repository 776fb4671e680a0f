#!/bin/bash
# (Run in the nineteenth session, 2026-12-01; results in NOTES.md. Variant names without macros
# are that day's defaults: dQ staging per warpgroup and the dV split came on after the first two.)
# hdim 128, on the adopted per-warpgroup dQ staging and dV split: 16-byte dQ staging stores
# (FLASH_BWD_DEV_DQ_VEC=4, FA3's STS.128: 12 STS per step instead of 20) and D read before the dP^T
# wait (FLASH_BWD_DEV_STATS_EARLY=2: local SASS 14 of 32 MUFUs before that wait, FA3's 14-16),
# alone and together, 3 rounds against cuDNN at 1k / 8k. About 4 minutes.
#   run: bash tools/device_plan_bwd_vec_d.sh      (carry .whl)
bash tools/device_variants_only.sh \
  "@200 --bwd --rounds 3 --seqlens 1024,8192 --hdim 128 --variant r0 --variant r1:FLASH_BWD_DEV_DQ_VEC=4 \
   --variant r2:FLASH_BWD_DEV_STATS_EARLY=2 --variant r3:FLASH_BWD_DEV_DQ_VEC=4,FLASH_BWD_DEV_STATS_EARLY=2"
