#!/bin/bash
# (Run in the nineteenth session, 2026-12-01; results in NOTES.md. Variant names without macros
# are that day's defaults: dQ staging per warpgroup and the dV split came on after the first two.)
# dQ staged per warpgroup on the SS path (hdim 256: FLASH_BWD_DEV_DQ_PER_WG=2), 3 rounds against
# cuDNN at 1k / 8k. About 3 minutes.
#   run: bash tools/device_plan_bwd_ss_dq.sh      (carry .whl)
bash tools/device_variants_only.sh \
  "@170 --bwd --rounds 3 --seqlens 1024,8192 --hdim 256 --variant p0 --variant p1:FLASH_BWD_DEV_DQ_PER_WG=2"
