#!/bin/bash
# The backward's dQ one step late (FLASH_BWD_DEV_DQ_LAG=1; flash_bwd_kernel.h, kDqLag; RS kernels
# with per-warpgroup dQ staging and the split dV, i.e. default mode at hdim 64 / 128): a step ends
# with its dV rest and dK issued; the next step meets the other warpgroup while they run (the
# meeting no longer stands where the tensor pipe has nothing queued), waits for them, issues the
# previous step's dQ and its own S^T, and stages that dQ while S^T runs (dP^T issued after it).
# Local build: no "Performance Loss", no spills in the step loops (471 instructions and 40
# HGMMAs in the non-causal loop against 422 / 32: the S^T issue is in two branches).
# Prediction: +1-3 % at hdim 128 (the meeting's wait overlaps dV / dK; dQ's staging overlaps
# S^T), more at short sequences where the steps are the same but tiles are fewer.
#   run: bash tools/device_plan_bwd_dq_lag.sh      (carry .whl; ~2.5 min, timeout_s 300)
bash tools/device_variants_only.sh \
  "@200 --bwd --rounds 3 --seqlens 512,2048,8192 --hdim 128 --variant l0 --variant l1:FLASH_BWD_DEV_DQ_LAG=1"
