#!/bin/bash
# One quad transpose for both directions (FLASH_FWD_DEV_QUAD3=1): the forward's direct O store
# (flash_fwd_kernel.h store_o_direct) with utils.h's quad_transpose, the backward's dK/dV form
# (3 shuffles + selects), against its own two butterfly steps (4 shuffles). If q3 is within the
# spread of q0, the butterfly goes and the macro with it.
# Prediction: within +-1 % (64 of ~3700 instructions per tile at hdim 256 are the shuffles).
#   run: bash tools/device_plan_fwd_quad3.sh      (carry .whl; ~2.5 min, timeout_s 240)
bash tools/device_variants_only.sh \
  "@150 --hdim 256 --rounds 3 --causal 0,1 --seqlens 512,768,2048 --variant q0 --variant q3:FLASH_FWD_DEV_QUAD3=1"
