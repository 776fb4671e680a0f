#!/bin/bash
# MEASURED (twenty-second session; the knob was removed after, code at the commit that added this
# plan): x cuDNN non-causal 1k / 8k, causal 1k / 8k: hdim 128 j0 1.095 / 1.097, 1.075 / 1.134;
# e4 1.043 / 1.070, 0.990 / 1.092; e8 1.081 / 1.097, 1.064 / 1.129. hdim 64 k0 1.150 / 1.180,
# 1.203 / 1.236; f4 1.058 / 1.133, 1.092 / 1.169; f2 1.057 / 1.088, 1.135 / 1.159. Wrong: -1 to
# -9 %, more the more elements move. MUFU is not what the step waits for.
# P^T's exponentials partly on the FMA pipe (FLASH_BWD_DEV_EXP_EMU=N: one in N by exp2_fma,
# utils.h, a degree-3 polynomial with relative error 7.5e-5; the rest on MUFU). ncu put 9 % of the
# hdim 128 step loop's stall samples on MUFU (MIO throttle, wait), FA3's under 2 % (twentieth
# session). Local SASS (twenty-second session): hdim 128 step loop 426 -> 499 instructions with
# N = 4 (MUFU 32 -> 24), no new spills; hdim 64 609 -> 754. Prediction: hdim 128 -1 to +2 %,
# hdim 64 (MUFU twice as heavy per FLOP) 0 to +3 %. 3 rounds against cuDNN at 1k / 8k;
# variants.py checks the gradients first. ~3 minutes.
#   run: bash tools/device_plan_bwd_exp_emu.sh      (carry .whl; timeout_s 400)
bash tools/device_variants_only.sh \
  "@170 --bwd --rounds 3 --seqlens 1024,8192 --hdim 128 --variant j0 --variant e4:FLASH_BWD_DEV_EXP_EMU=4 \
   --variant e8:FLASH_BWD_DEV_EXP_EMU=8" \
  "@170 --bwd --rounds 3 --seqlens 1024,8192 --hdim 64 --variant k0 --variant f4:FLASH_BWD_DEV_EXP_EMU=4 \
   --variant f2:FLASH_BWD_DEV_EXP_EMU=2"
