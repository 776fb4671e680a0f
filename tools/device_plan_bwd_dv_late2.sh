#!/bin/bash
# Follow-ups to kDvLate (twenty-first session), each against today's defaults:
#   r1: hdim 128, two K blocks of the dV GEMM before the dP^T wait instead of one (with the rest
#       now behind dQ, more exps may precede that wait at no cost to dQ);
#   s1: hdim 64, the rest of dV between dQ and dK (DV_LATE=2) in every kernel (today: behind
#       both in causal kernels, before the meeting in non-causal ones, where 1 lost 2 %).
# Prediction: r1 0 to +1.5 %; s1 non-causal 0 to +2 %, causal within 1 % of today's.
#   run: bash tools/device_plan_bwd_dv_late2.sh      (carry .whl; ~4 min)
bash tools/device_variants_only.sh \
  "@150 --bwd --rounds 3 --seqlens 2048,8192 --hdim 128 --variant r0 --variant r1:FLASH_BWD_DEV_DV_SPLIT_BLOCKS=2" \
  "@180 --bwd --rounds 3 --seqlens 1024,8192 --deterministic --hdim 64 --variant s0 --variant s1:FLASH_BWD_DEV_DV_LATE=2"
