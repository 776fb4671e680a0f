#!/bin/bash
# WGMMA operands partitioned through the warpgroup's first thread (warp-uniform, utils.h
# warpgroup_first_thread) against the thread's own index (FLASH_DEV_THREAD_SLICE=1, main before).
# Found comparing SASS with FA3's backward (which shuffles its warpgroup index for this): sliced
# per thread, the compiler built every descriptor of a multi-warpgroup TiledMMA in vector
# registers and moved it with R2UR before each HGMMA. Local build, hdim 128 backward step loop:
# 515 -> 463 instructions per warp and step (R2UR 48 -> 0), no new spills, no "Performance Loss";
# forward: Q's descriptors no longer held in 16 vector registers.
# Prediction (x cuDNN, same run): backward hdim 128 +2-5 %, forward hdim 128 +0-2 %.
# Measured (2026-11-30, seventeenth session): backward nc 1k / 8k, causal 1k / 8k 1.028 / 1.014 /
# 1.042 / 1.064 -> 1.043 / 1.020 / 1.042 / 1.068; forward nc 512 / 8k, causal 512 / 8k 1.062 /
# 1.153 / 1.010 / 1.144 -> 1.059 / 1.141 / 1.017 / 1.151: within the spread. Adopted for the
# leaner code (full suite passed after it).
# ~4-5 minutes.   run: bash tools/device_plan_uniform_slice.sh   (carry .whl)
bash tools/device_variants_only.sh \
  "@220 --bwd --hdim 128 --rounds 3 --seqlens 1024,8192 --causal 0,1 --variant bt1:FLASH_DEV_THREAD_SLICE=1 --variant bu0" \
  "@160 --hdim 128 --rounds 3 --seqlens 512,8192 --causal 0,1 --variant ft1:FLASH_DEV_THREAD_SLICE=1 --variant fu0"
