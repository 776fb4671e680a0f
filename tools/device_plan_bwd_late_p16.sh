#!/bin/bash
# hdim 64 backward: the 16-bit P^T made after dS^T (FLASH_BWD_DEV_LATE_P16; 1: non-causal kernels,
# 2: every kernel), so that dS^T uses the float32 P^T (one rounding less) and the step loop drops
# the widening of the 16-bit copy (local SASS: non-causal 759 -> 609 instructions per step, no
# spills; causal loops 6-15 LDL per step with 2; with 2 and two K blocks of the dV GEMM before
# the dP^T wait (n3) no loop spills anywhere: causal 1041 / 629 per masked / unmasked step, against
# 1208 / 774). Prediction: non-causal +3-8 %, causal with 2: -3 to +3 %, n3 causal +2-6 %.
# 3 rounds against cuDNN at 1k / 8k, deterministic kernels too. Then (second set)
# item 0a of NOTES: D read before the dP^T wait at hdim 128 (FLASH_BWD_DEV_STATS_EARLY=2) at
# 2k / 16k. Third set: hdim 256 (SS path) with P^T written to shared memory before the dP^T wait
# (FLASH_BWD_DEV_SS_P_EARLY=1: local SASS 16 of 16 MUFUs before it, against 3; no loop spills);
# prediction +1-3 %. About 8 minutes.
# Measured in the twentieth session and adopted: the default is now n1's kernels where not
# causal and n3's where causal, so n0 here reads today's default (the nineteenth session's kernels:
# FLASH_BWD_DEV_LATE_P16=0,FLASH_BWD_DEV_DV_SPLIT_BLOCKS=1).
#   run: bash tools/device_plan_bwd_late_p16.sh      (carry .whl)
bash tools/device_variants_only.sh \
  "@300 --bwd --rounds 3 --seqlens 1024,8192 --deterministic --hdim 64 --variant n0 \
   --variant n1:FLASH_BWD_DEV_LATE_P16=1 --variant n2:FLASH_BWD_DEV_LATE_P16=2 \
   --variant n3:FLASH_BWD_DEV_LATE_P16=2,FLASH_BWD_DEV_DV_SPLIT_BLOCKS=2" \
  "@200 --bwd --rounds 3 --seqlens 2048,16384 --hdim 128 --variant q0 --variant q2:FLASH_BWD_DEV_STATS_EARLY=2" \
  "@150 --bwd --rounds 3 --seqlens 1024,8192 --hdim 256 --variant t0 --variant t1:FLASH_BWD_DEV_SS_P_EARLY=1"
