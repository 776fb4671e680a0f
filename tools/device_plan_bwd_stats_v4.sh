#!/bin/bash
# hdim 64 backward: the LSE2 / D reads as 16-byte loads from permuted runs (FLASH_BWD_DEV_STATS_V4;
# 1: every kernel, 2: non-causal kernels only). ncu (twentieth session, hdim 64 causal 8k): our
# consumers issue 32 LDS.64 per 128-query step for the stats (34.1 M LDS, 133 M shared-load
# wavefronts) against FA3's 8 LDS (8.5 M / 30 M), and its tensor pipe is busy 64 % of the cycles
# against our 58 %. Local SASS: 16 LDS.128 per step; non-causal loops 609 / 600 -> 604 / 586
# instructions, no spills; causal 1041 / 629 -> 860 / 620 with 4-6 LDL per step (hence =2).
# Prediction: non-causal +1-3 %, causal (=1) -2 to +2 %. 3 rounds against cuDNN at 1k / 8k,
# deterministic kernels too; variants.py checks each variant's gradients first. ~4 minutes.
#   run: bash tools/device_plan_bwd_stats_v4.sh      (carry .whl)
bash tools/device_variants_only.sh \
  "@220 --bwd --rounds 3 --seqlens 1024,8192 --deterministic --hdim 64 --variant w0 \
   --variant w1:FLASH_BWD_DEV_STATS_V4=1 --variant w2:FLASH_BWD_DEV_STATS_V4=2"
