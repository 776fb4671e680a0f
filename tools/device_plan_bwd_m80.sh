#!/bin/bash
# hdim 128 non-causal backward in 80-query steps (FLASH_BWD_DEV_M80=1: FA3's shape there; S^T /
# dP^T as m64n80 WGMMAs, dQ computed transposed, the workspaces padded to 640 rows). Local SASS
# (twentieth session), the persistent non-causal kernel's step loop, against today's 450 per 64
# queries (7.0 per query) and FA3's 510 per 80 (6.4):
#   e1  M80                                   610 (7.6 per query; dS^T from the 16-bit P^T: ~100
#                                              PRMT / IMAD.U32 widen it), 2 LDL + 1 STL per step
#   e2  M80 + LATE_P16=1                      535 (6.7), 13 LDL + 12 STL per step (loop state spilled
#                                              around the GEMMs: 208 accumulator registers live)
#   e3  M80 + LATE_P16=1 + DV_SPLIT=0         531, 12 LDL + 10 STL
# The deterministic kernel (non-causal, 80 queries too) keeps its dV-before order: 598 per step.
# Prediction: e1 -3 to +2 % (more instructions per query), e2 / e3 -2 to +4 % (the spills hit L1).
# variants.py checks each variant's gradients first (awkward shapes: 80 does not divide them).
# 3 rounds against cuDNN at 2k / 8k, non-causal only (causal kernels keep 64), deterministic too.
# ~5 minutes.
#   run: bash tools/device_plan_bwd_m80.sh      (carry .whl)
bash tools/device_variants_only.sh \
  "@280 --bwd --rounds 3 --seqlens 2048,8192 --causal 0 --deterministic --hdim 128 --variant e0 --variant e1:FLASH_BWD_DEV_M80=1 \
   --variant e2:FLASH_BWD_DEV_M80=1,FLASH_BWD_DEV_LATE_P16=1 \
   --variant e3:FLASH_BWD_DEV_M80=1,FLASH_BWD_DEV_LATE_P16=1,FLASH_BWD_DEV_DV_SPLIT=0"
