#!/bin/bash
# Main (eighteenth session), after adopting 128-query steps at hdim 64. The record of a run: the
# FLASH_BWD_DEV_DQ_VEC knob (variants x4, xb, y4) was removed after it measured -3 to +2 %, so
# those variants no longer change anything (the code they measured: commit 1962b54).
# 1. dQ staged with 16-byte stores (FLASH_BWD_DEV_DQ_VEC=4, FA3's STS.128) instead of 8-byte ones:
#    ncu (hdim 128 causal 8k) put 6 % of the consumers' stall samples on the staging's STS.64,
#    as MIO-queue stalls; half as many store instructions. Prediction: +0.5-2 % at hdim 128,
#    +0-1 % at hdim 64.
# 2. hdim 128 with the dV GEMM after dS^T (FA3's order; measured within 2 % in the eighth
#    session, before the persistent kernels and the uniform operand slices). Prediction: 0 +-2 %.
# 3. hdim 64 deterministic mode: 128-query steps (now the default for every mode) against
#    64-query steps (z0: FLASH_BWD_DEV_BLOCK_M=64, the old deterministic kernel). The eighth
#    session measured +7-9 % non-causal. Prediction: +5-10 % non-causal, 0-5 % causal.
# ~4 minutes.   run: bash tools/device_plan_bwd_dq_vec.sh   (carry .whl)
bash tools/device_variants_only.sh \
  "@190 --bwd --hdim 128 --rounds 3 --seqlens 1024,8192 --causal 0,1 --variant x0 --variant x4:FLASH_BWD_DEV_DQ_VEC=4 --variant xd:FLASH_BWD_DEV_DV_AFTER_DS=1 --variant xb:FLASH_BWD_DEV_DQ_VEC=4,FLASH_BWD_DEV_DV_AFTER_DS=1" \
  "@200 --bwd --hdim 64 --rounds 3 --seqlens 1024,8192 --causal 0,1 --deterministic --variant y0 --variant y4:FLASH_BWD_DEV_DQ_VEC=4 --variant z0:FLASH_BWD_DEV_BLOCK_M=64"
