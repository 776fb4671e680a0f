#!/bin/bash
# (Run in the nineteenth session, 2026-12-01; results in NOTES.md. Variant names without macros
# are that day's defaults: dQ staging per warpgroup and the dV split came on after the first two.)
# Confirmation of tools/device_plan_bwd_next.sh's winners before adopting them, 3 rounds against
# cuDNN: hdim 128 at 2k / 16k (dQ per warpgroup, and with the split dV GEMM); hdim 64 with dQ per
# warpgroup alone; hdim 96 with both. About 5 minutes.
#   run: bash tools/device_plan_bwd_next2.sh      (carry .whl)
bash tools/device_variants_only.sh \
  "@200 --bwd --rounds 3 --seqlens 2048,16384 --hdim 128 --variant e0 --variant e2:FLASH_BWD_DEV_DQ_PER_WG=1 \
   --variant e3:FLASH_BWD_DEV_DV_SPLIT=1,FLASH_BWD_DEV_DQ_PER_WG=1" \
  "@130 --bwd --rounds 3 --seqlens 1024,8192 --hdim 64 --variant g0 --variant g2:FLASH_BWD_DEV_DQ_PER_WG=1" \
  "@130 --bwd --rounds 3 --seqlens 1024,8192 --hdim 96 --variant h0 \
   --variant h3:FLASH_BWD_DEV_DV_SPLIT=1,FLASH_BWD_DEV_DQ_PER_WG=1"
