#!/bin/bash
# dQ finished inside the backward main kernel (FLASH_BWD_DEV_FUSED_DQ=1; tile_size.h,
# bwd_fused_dq; flash_bwd_kernel.h, kFusedDq), default mode, head dims 64 and 128: no postprocess
# kernel. NOTES.md, twenty-third and twenty-fourth sessions, has every form measured so far:
# - per-step counts per dQ block (the first forms): correct, 3x slower;
# - without counts (dq wrong, a diagnosis): x cuDNN 1.16-1.19 / 1.08-1.10 at 512 / 8k, what the
#   postprocess costs;
# - per-tile counts (in the reducer, or in the converter via a mailbox: the same): hdim 128
#   non-causal 0.40-0.41 / 1.01-1.02 against the default's 1.07-1.09.
# Twenty-fourth session (this plan): the converter's warp 2 no longer diverges between thread 0's
# polling and the other lanes' mbarrier try_wait; 16-byte conversion chunks; a CTA whose reducer
# is done stays to convert while every tile has started (q1, r1; q2 without that rule:
# FLASH_BWD_DEV_FUSED_TAIL=0).
#   run: bash tools/device_plan_bwd_fused_dq.sh      (carry .whl; ~2.5 min, timeout_s 300)
# Then: thread 0 takes 8 blocks per cursor move (FLASH_BWD_DEV_FUSED_TAKE, default 8): 512 keys
# 0.39 -> 0.83 (take 32: 0.74), 8k 1.050 (default 1.058). Now: jobs of half a block in two
# slots, one copied while the other converts (q1 take 8, q2 take 2).
# Measured (twenty-fourth session, x cuDNN, 512 / 8k): non-causal q0 1.069 / 1.055, q1 0.859 /
# 1.089, q2 0.634 / 1.108; causal q0 1.066 / 1.151, q1 0.755 / 1.057, q2 0.518 / 1.108.
# Now take 2 is the default: where does it win (the host would pick fused by size)?
bash tools/device_variants_only.sh \
  "@230 --bwd --rounds 2 --seqlens 1024,2048,4096,16384 --hdim 128 --variant q0 --variant q2:FLASH_BWD_DEV_FUSED_DQ=1" \
  "@170 --bwd --rounds 2 --seqlens 2048,8192 --hdim 64 --variant r0 --variant r2:FLASH_BWD_DEV_FUSED_DQ=1"
