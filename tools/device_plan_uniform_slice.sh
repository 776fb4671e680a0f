#!/bin/bash
# WGMMA operands partitioned through the warpgroup's first thread (warp-uniform, utils.h
# warpgroup_first_thread) against the thread's own index (FLASH_DEV_THREAD_SLICE=1, main before).
# Found comparing SASS with FA3's backward (which shuffles its warpgroup index for this): sliced
# per thread, the compiler built every descriptor of a multi-warpgroup TiledMMA in vector
# registers and moved it with R2UR before each HGMMA. Local build, hdim 128 backward step loop:
# 515 -> 463 instructions per warp and step (R2UR 48 -> 0), no new spills, no "Performance Loss";
# forward: Q's descriptors no longer held in 16 vector registers.
# Prediction (x cuDNN, same run): backward hdim 128 +2-5 %, forward hdim 128 +0-2 %.
# ~4-5 minutes.   run: bash tools/device_plan_uniform_slice.sh   (carry .whl)
bash tools/device_variants_only.sh \
  "@220 --bwd --hdim 128 --rounds 3 --seqlens 1024,8192 --causal 0,1 --variant bt1:FLASH_DEV_THREAD_SLICE=1 --variant bu0" \
  "@160 --hdim 128 --rounds 3 --seqlens 512,8192 --causal 0,1 --variant ft1:FLASH_DEV_THREAD_SLICE=1 --variant fu0"
