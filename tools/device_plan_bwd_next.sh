#!/bin/bash
# (Run in the nineteenth session, 2026-12-01; results in NOTES.md. Variant names without macros
# are that day's defaults: dQ staging per warpgroup and the dV split came on after the first two.)
# Backward experiments of the nineteenth session (macros in flash_bwd_kernel.h, default off; the
# default kernels' SASS is unchanged by them), 3 rounds against cuDNN in one process:
#   FLASH_BWD_DEV_DV_SPLIT=1     dV GEMM's first half issued before the dP^T wait (22 of 32 MUFUs
#                                before that wait at hdim 128, 61 of 64 at hdim 64, against 1 / 8)
#   FLASH_BWD_DEV_DQ_PER_WG=1    dQ staged per warpgroup with its own 160-thread barrier pair
#   FLASH_BWD_DEV_STATS_EARLY=1  LSE read before the S^T wait (with DV_SPLIT)
#   FLASH_BWD_DEV_DV_AFTER_DS=1  deterministic mode in the dV-after-dS^T order too
# Sets: hdim 128 default mode; hdim 64; hdim 128 deterministic. About 7 minutes.
#   run: bash tools/device_plan_bwd_next.sh      (carry .whl)
C="--bwd --rounds 3 --seqlens 1024,8192"
bash tools/device_variants_only.sh \
  "@230 $C --hdim 128 --variant a0 --variant a1:FLASH_BWD_DEV_DV_SPLIT=1 --variant a2:FLASH_BWD_DEV_DQ_PER_WG=1 \
   --variant a3:FLASH_BWD_DEV_DV_SPLIT=1,FLASH_BWD_DEV_DQ_PER_WG=1 \
   --variant a4:FLASH_BWD_DEV_DV_SPLIT=1,FLASH_BWD_DEV_STATS_EARLY=1" \
  "@150 $C --hdim 64 --variant b0 --variant b1:FLASH_BWD_DEV_DV_SPLIT=1 \
   --variant b3:FLASH_BWD_DEV_DV_SPLIT=1,FLASH_BWD_DEV_DQ_PER_WG=1" \
  "@170 --bwd --rounds 3 --seqlens 8192 --deterministic --hdim 128 --variant c0 --variant c2:FLASH_BWD_DEV_DQ_PER_WG=1 \
   --variant c5:FLASH_BWD_DEV_DV_AFTER_DS=1,FLASH_BWD_DEV_DV_SPLIT=1"
