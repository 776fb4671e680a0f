#!/bin/bash
# The dQ postprocess overlapped with the backward main kernel's last wave (FLASH_BWD_DEV_PDL_POST=1;
# tile_size.h, bwd_pdl_post; default mode, head dims 64 / 128). The main kernel's CTAs allow the
# programmatic dependent launch at their start; the reducer warp counts each tile's finished
# additions per (KV head, batch) group (a release add after a later step's wait_group); a
# postprocess CTA waits for its group's count, so its CTAs run on the SMs the last wave leaves
# idle (at 8k the last wave holds 68 of 2048 tiles on 132 SMs: ~64 SMs idle for one tile time,
# ~75 us, against the postprocess's 48 us on the whole GPU).
# Prediction: +2-3 % at 8k non-causal, +1-2 % at 512, less under the causal schedule (longest
# first: a short last wave).
#   run: bash tools/device_plan_bwd_pdl_post.sh      (carry .whl; ~3 min, timeout_s 330)
# Measured (twenty-fourth session, 3 rounds, x cuDNN, 512 / 2k / 8k / 16k): hdim 128 non-causal
# p0 1.083 / 1.113 / 1.088 / 1.088, p1 1.093 / 1.116 / 1.077 / 1.066; causal p0 1.043 / 1.118 /
# 1.141 / 1.086, p1 1.054 / 1.118 / 1.132 / 1.072; hdim 64 (512 / 8k) s0 1.147 / 1.165, s1 1.157 /
# 1.142, causal s0 1.175 / 1.245, s1 1.171 / 1.233. +1 % at 512, -1-2 % from 8k.
# Then, where the cost is: p2 without the proxy fence before the count (FLASH_BWD_DEV_PDL_FENCE=0);
# p3 the counts and the postprocess's wait, launched plainly (FLASH_BWD_DEV_PDL_LAUNCH=0: the
# counting's own cost).
bash tools/device_variants_only.sh \
  "@200 --bwd --rounds 3 --seqlens 512,8192,16384 --hdim 128 --variant p0 --variant p1:FLASH_BWD_DEV_PDL_POST=1 --variant p2:FLASH_BWD_DEV_PDL_POST=1,FLASH_BWD_DEV_PDL_FENCE=0 --variant p3:FLASH_BWD_DEV_PDL_POST=1,FLASH_BWD_DEV_PDL_LAUNCH=0"
# Measured (same session, next run, 3 rounds, x cuDNN, 512 / 8k / 16k): non-causal p0 1.044 /
# 1.091 / 1.070, p1 1.066 / 1.078 / 1.081, p2 1.072 / 1.101 / 1.074, p3 1.073 / 1.085 / 1.073;
# causal p0 1.014 / 1.092 / 1.074, p1 1.061 / 1.061 / 1.073, p2 1.068 / 1.093 / 1.082, p3 1.044 /
# 1.098 / 1.051. p3 (no overlap possible) beat p0 at 512 as much as p1 did: all within the
# spread. Not adopted; removed after this commit.
