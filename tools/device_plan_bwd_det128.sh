#!/bin/bash
# MEASURED (twenty-second session): x1-det 0.910 / 0.976, 0.970 / 1.033 against 0.897 / 0.980,
# 0.946 / 1.023 (+0.9 % on average, inside the spread): not taken.
# hdim 128 deterministic backward in the dV-after-dS order, with today's split (the dV GEMM's
# first K block before the dP^T wait) and per-warpgroup dQ staging: x1 (FLASH_BWD_DEV_DV_AFTER_DS=1)
# against x0 (the default: the deterministic kernel issues the dV GEMM before dS^T). Measured
# +2-3 % (c5-det, nineteenth session, before the split moved to one K block). x1's default-mode
# kernels are the default's (the macro only changes the deterministic ones at hdim 128), so its
# non-det columns read the spread. Prediction: deterministic +1-3 %. 3 rounds against cuDNN at
# 1k / 8k; variants.py checks both modes' gradients first. ~3 minutes.
# If it holds: bwd_dv_after_ds in csrc/kernel/tile_size.h takes it for deterministic hdim 128.
#   run: bash tools/device_plan_bwd_det128.sh      (carry .whl)
bash tools/device_variants_only.sh \
  "@200 --bwd --rounds 3 --seqlens 1024,8192 --deterministic --hdim 128 --variant x0 \
   --variant x1:FLASH_BWD_DEV_DV_AFTER_DS=1"
