#!/bin/bash
# MEASURED (twenty-third session; NOTES.md has every form and number): the fused dQ is correct
# (every gradient check passed with poisoned outputs) but 3x slower: hdim 128 non-causal x cuDNN
# 0.44 / 0.32 at 512 / 8k against 1.07 / 1.07. Without the counts (dq wrong, a diagnosis) it read
# 1.16-1.19 / 1.08-1.10: the postprocess kernel is worth +10 % at 512 and +1-2 % at 8k. What
# costs is the per-step atomic whose result the reducer lane keeps (a round trip to L2 behind the
# reduce-adds) plus the job hand-off; a `red` per step is nearly free.
# dQ finished inside the backward main kernel (FLASH_BWD_DEV_FUSED_DQ=1; tile_size.h,
# bwd_fused_dq; flash_bwd_kernel.h, kFusedDq), default mode, head dims 64 and 128, non-causal:
# the reducer counts each step's completed additions per dQ block, and the CTA whose count
# completes a block hands it to two spare producer warps, which write dq (no postprocess kernel).
# Prediction was +1.5-2 % at 8k, +10-20 % at 512.
#   run: bash tools/device_plan_bwd_fused_dq.sh      (carry .whl; ~3 min, timeout_s 330)
bash tools/device_variants_only.sh \
  "@200 --bwd --rounds 3 --seqlens 512,2048,8192 --causal 0 --hdim 128 --variant q0 --variant q1:FLASH_BWD_DEV_FUSED_DQ=1" \
  "@160 --bwd --rounds 3 --seqlens 512,2048,8192 --causal 0 --hdim 64 --variant r0 --variant r1:FLASH_BWD_DEV_FUSED_DQ=1"
