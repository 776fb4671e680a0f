#!/bin/bash
# Where the rest of the dV GEMM is issued (kDvLate, flash_bwd_kernel.h). First run (twenty-first
# session, 1k / 8k): hdim 128 DV_LATE=2 +0.7 / +1.0 %, -1.0 / +1.8 %; hdim 64 DV_LATE=1 causal
# +8 / +2 % (deterministic +0.4 / +3 %), non-causal -2 %. Taken as defaults (2 at hdim 128, 1 in
# hdim 64's causal kernels); this run confirms them against the old order (DV_LATE=0) at 2k / 16k
# (hdim 128) and at 1k / 8k causal (hdim 64).
#   run: bash tools/device_plan_bwd_dv_late.sh      (carry .whl; ~3 min)
bash tools/device_variants_only.sh \
  "@160 --bwd --rounds 3 --seqlens 2048,16384 --hdim 128 --variant n0 --variant n1:FLASH_BWD_DEV_DV_LATE=0" \
  "@160 --bwd --rounds 3 --seqlens 1024,8192 --causal 1 --deterministic --hdim 64 --variant p0 --variant p1:FLASH_BWD_DEV_DV_LATE=0"
