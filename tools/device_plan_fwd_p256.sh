#!/bin/bash
# hdim 256 persistent at every key length now that its persistent kernels store O from registers
# (kDirectO) and release Q after the last Q.K^T GEMM: FLASH_FWD_PERSISTENT=1 (p256) against the
# table (persistent below 1k keys only; before kDirectO persistent lost from 1k).
# Prediction: 1k / 2k +1-3 %, 8k +-1 % (a tile's Q wait is a small share of 64+ key blocks).
# Adopted below 4k keys (tile_size.h): since then t256 and p256 differ only at 8k.
#   run: bash tools/device_plan_fwd_p256.sh      (carry .whl; ~2.5 min, timeout_s 240)
bash tools/device_variants_only.sh \
  "@150 --hdim 256 --rounds 3 --causal 0,1 --seqlens 1024,2048,8192 --variant t256 --variant p256:FLASH_FWD_PERSISTENT=1"
