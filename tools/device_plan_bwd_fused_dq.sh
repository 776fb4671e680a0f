#!/bin/bash
# dQ finished inside the backward main kernel (FLASH_BWD_DEV_FUSED_DQ=1; tile_size.h,
# bwd_fused_dq; flash_bwd_kernel.h, kFusedDq), default mode, head dims 64 and 128: no postprocess
# kernel. NOTES.md, twenty-third session, has every form measured so far:
# - per-step counts per dQ block (the first forms): correct, 3x slower (x cuDNN hdim 128
#   non-causal 0.44 / 0.32 at 512 / 8k against 1.07 / 1.07);
# - without counts (dq wrong, a diagnosis): 1.16-1.19 / 1.08-1.10, what the postprocess costs;
# - per-tile counts in the reducer warp, groups published to a global list that every CTA's
#   converter warps drain: correct, hdim 128 0.412 / 1.022 (non-causal 512 / 8k), 0.332 / 0.914
#   (causal) against 1.074 / 1.091, 1.058 / 1.128; hdim 64 0.492 / 1.082, 0.421 / 1.077 against
#   1.181 / 1.184, 1.189 / 1.222.
# NOT YET MEASURED (the session's device time ran out): the per-tile count moved off the reducer
# warp (its leader posts the tile's group to a mailbox once a later step's wait_group shows the
# tile's additions complete; converter thread 0 counts it). Prediction: 8k back to >= the
# default's ratio (+1-2 %), 512 still below (the conversions are short of parallelism there) -
# if so, look at the conversion's own cost next (one 32 KB block per job, 4-byte stores).
#   run: bash tools/device_plan_bwd_fused_dq.sh      (carry .whl; ~2.5 min, timeout_s 300)
bash tools/device_variants_only.sh \
  "@150 --bwd --rounds 2 --seqlens 512,8192 --hdim 128 --variant q0 --variant q1:FLASH_BWD_DEV_FUSED_DQ=1" \
  "@150 --bwd --rounds 2 --seqlens 512,8192 --hdim 64 --variant r0 --variant r1:FLASH_BWD_DEV_FUSED_DQ=1"
