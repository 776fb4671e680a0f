#!/bin/bash
# O straight from registers to global memory in the persistent forward kernels that stage O in
# Q's buffer (FLASH_FWD_DEV_DIRECT_O=1; flash_fwd_kernel.h, kDirectO): hdim 256 short keys
# (non-causal 128x80, causal 128x64) and hdim 128's long-keys 128x176. Today the next tile's Q
# loads only after this tile's O TMA store has read Q's buffer, and the next tile's first GEMM
# waits for it; with direct stores Q is released after the tile's last Q.K^T GEMM, as in the
# own-O kernels. Local build: no "Performance Loss", no spills (64 STG.32 per thread at hdim 256
# in place of 16 STSM + the TMA store); the default SASS is unchanged.
# Prediction: hdim 256 non-causal / causal 512 +3-8 % (7 / 4-8 key blocks per tile: the Q wait
# is a large share), 768 +2-5 %, 1024 (one CTA per tile, unaffected) +-0; hdim 128 with the
# 128x176 tile everywhere (l128 against dl128) +1-3 %, and dl128 against o128 (128x128 own O
# at 8192 / 16384) within +-2 %.
#   run: bash tools/device_plan_fwd_direct_o.sh      (carry .whl; ~7 min, timeout_s 480)
bash tools/device_variants_only.sh \
  "@170 --hdim 256 --rounds 3 --causal 0,1 --seqlens 512,768,1024 --variant o256 --variant d256:FLASH_FWD_DEV_DIRECT_O=1" \
  "@170 --hdim 128 --rounds 3 --causal 0 --seqlens 4096,8192,8448,16384 --variant o128 --variant l128:FLASH_FWD_LONG_TILE_RATIO=0 --variant dl128:FLASH_FWD_LONG_TILE_RATIO=0,FLASH_FWD_DEV_DIRECT_O=1"
