#!/bin/bash
# (Run in the nineteenth session, 2026-12-01; results in NOTES.md. Variant names without macros
# are that day's defaults: dQ staging per warpgroup and the dV split came on after the first two.)
# Where to split the dV GEMM around the dP^T wait (FLASH_BWD_DEV_DV_SPLIT_BLOCKS: K blocks issued
# before it), on top of the adopted dQ staging per warpgroup, 3 rounds against cuDNN:
# hdim 128 (4 K blocks): 2 (default) / 1 / 3; hdim 64 (8 K blocks): no split (default) / 1 / 2,
# both with the deterministic kernels too. About 6 minutes.
#   run: bash tools/device_plan_bwd_split.sh      (carry .whl)
bash tools/device_variants_only.sh \
  "@230 --bwd --rounds 3 --seqlens 1024,8192 --deterministic --hdim 128 --variant k0 --variant k1:FLASH_BWD_DEV_DV_SPLIT_BLOCKS=1 \
   --variant k3:FLASH_BWD_DEV_DV_SPLIT_BLOCKS=3" \
  "@200 --bwd --rounds 3 --seqlens 1024,8192 --deterministic --hdim 64 --variant m0 \
   --variant m1:FLASH_BWD_DEV_DV_SPLIT=1,FLASH_BWD_DEV_DV_SPLIT_BLOCKS=1 \
   --variant m2:FLASH_BWD_DEV_DV_SPLIT=1,FLASH_BWD_DEV_DV_SPLIT_BLOCKS=2"
