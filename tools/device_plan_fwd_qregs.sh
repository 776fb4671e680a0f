#!/bin/bash
# Q in registers for S = Q.K^T (FLASH_FWD_DEV_Q_REGS, flash_fwd_kernel.h kQRegs): each consumer
# warpgroup loads its 64 Q rows with ldmatrix once per tile and issues Q.K^T as RS WGMMAs, so a
# key block reads K and V from shared memory but not Q (a fifth less shared-memory traffic at
# hdim 128; +32 registers, no spills: hdim 128 non-causal 128x128 R220, causal R229 of 240).
# Prediction: +0-2 % at hdim 128 from 8k (the grid is power-bound; shared-memory reads cost energy),
# within the spread at 1k; hdim 64 (=2, 16 registers) the same or a spill loss in its 192-row kernel.
#   run: bash tools/device_plan_fwd_qregs.sh      (carry .whl; ~4 min, timeout 330)
# Measured (twenty-sixth session): hdim 128 non-causal within the spread (1k / 8k / 16k x cuDNN
# 1.087 / 1.176 / 1.127 -> 1.086 / 1.178 / 1.124), causal -1 to -3 %; hdim 64 -27 to -37 %
# (its 192-row kernel). Rejected; removed in the next commit.
bash tools/device_variants_only.sh \
  "@150 --hdim 128 --rounds 3 --causal 0,1 --seqlens 1024,8192,16384 --variant a --variant q:FLASH_FWD_DEV_Q_REGS=1" \
  "@120 --hdim 64 --rounds 3 --causal 0,1 --seqlens 1024,8192 --variant c --variant d:FLASH_FWD_DEV_Q_REGS=2"
