#!/bin/bash
# NOTES "Next GPU session" item 0: what the 8448-key point has that 8192 lacks (hdim 128
# non-causal, 128x176 persistent). ~3.5 minutes cold (hdim 128 bf16 build, forward only).
#   8192:2:16  the grid point: 2048 tiles (15.52 waves), 46.5 key blocks (partial last block)
#   8192:2:33  whole waves (4224 = 32 x 132), partial last block
#   8448:2:16  16 whole waves, 48 whole key blocks
#   8448:1:16  the thirteenth session's point (8 whole waves)
#   8448:2:15  1980 tiles = 15.00 whole waves, whole blocks
# Prediction: the waves matter less than the block (tail splitting lost): 8192:2:33 within 1 %
# of 8192:2:16, 8448:2:16 +2-3 % over both.
#   run: bash tools/device_plan_shape_probe.sh      (carry .whl; SHAPES=... for others)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
export FLASH_ATTN_HOPPER_DISABLE_BACKWARD=1
export EXTRA_CMD="python3 tools/shape_probe.py --hdim 128 --rounds 3 --shapes ${SHAPES:-8192:2:16,8192:2:33,8448:2:16,8448:1:16,8448:2:15}"
HDIMS=128 DTYPES=bf16 STEPS=cmd CMD_TIMEOUT=100 bash tools/device_session.sh
