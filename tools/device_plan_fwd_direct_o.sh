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
# First run (4-byte stores, 64 STG.32 per thread at hdim 256; code at d43e232), x cuDNN:
#   hdim 256 non-causal 512 / 768 / 1024: o256 0.992 / 1.019 / 1.018, d256 0.888 / 0.926 / 1.021;
#   causal 0.994 / 1.020 / 1.003 against 0.843 / 0.899 / 1.007: wrong, -11 to -15 %;
#   hdim 128 at 4096 / 8192 / 8448 / 16384 TFLOP/s: o128 666 / 678 / 670 / 680, l128 (128x176
#   everywhere) 621 / 630 / 670 / 639, dl128 (the same, direct O) 615 / 652 / 680 / 655: the Q
#   release is worth +2.5-3.5 % to the 176-key tile, but the 128x128 own-O tile still wins.
# Second run: 16-byte stores (a 4 x 4 transpose across each quad of lanes, 4 shuffles per 16
# bytes; 16 STG.128 + 64 SHFL per thread at hdim 256). Prediction: hdim 256 512 / 768 back to
# o256 or up to +3 %; dl128 +0.5-1 % over the first run.
# Adopted (16-byte form): direct O is now the default, so the staged variants below set
# FLASH_FWD_DEV_DIRECT_O=0 and the plan still measures staged against direct.
#   run: bash tools/device_plan_fwd_direct_o.sh      (carry .whl; ~3.5 min, timeout_s 360)
bash tools/device_variants_only.sh \
  "@140 --hdim 256 --rounds 3 --causal 0,1 --seqlens 512,768 --variant o256:FLASH_FWD_DEV_DIRECT_O=0 --variant d256" \
  "@150 --hdim 128 --rounds 3 --causal 0 --seqlens 8192,16384 --variant o128 --variant l128:FLASH_FWD_LONG_TILE_RATIO=0,FLASH_FWD_DEV_DIRECT_O=0 --variant dl128:FLASH_FWD_LONG_TILE_RATIO=0"
