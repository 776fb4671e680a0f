#!/bin/bash
# Forward: O rescaled only when a row's max moved (FLASH_FWD_DEV_RESCALE=1: the warp skips the
# multiplies when no row of it moved; =2: also keeps a row's max unless the new one is more than
# 8 above it in the exp2 domain, so that rescales become rare), and at hdim 256 the 128x64 tile
# against 128x80 (causal short sequences). Variants only (no package build), about 4-5 minutes.
# Predictions (x cuDNN, 3 rounds): r1 +0-2 % at 2k-8k, r2 +1-4 % at hdim 256 2k-8k and +1-2 % at
# hdim 128, nothing at 512; n64 (hdim 256, 128x64) +3-5 % causal 512, -2-5 % from 2k.
#   run: bash tools/device_plan_fwd_rescale.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PYTHONPATH || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
V256="python3 tools/variants.py --hdim 256 --rounds 3 --seqlens 512,1024,2048,8192 --variant base256 \
  --variant r1_256:FLASH_FWD_DEV_RESCALE=1 --variant r2_256:FLASH_FWD_DEV_RESCALE=2 --variant n64_256:M=128,N=64,S=2"
V128="python3 tools/variants.py --hdim 128 --rounds 3 --seqlens 512,2048,8192 --variant base128 \
  --variant r1_128:FLASH_FWD_DEV_RESCALE=1 --variant r2_128:FLASH_FWD_DEV_RESCALE=2"
start=$(date +%s)
$V128 --build-only > "$OUT/build128.log" 2>&1 &
$V256 --build-only > "$OUT/build256.log" 2>&1
wait
echo "built in $(( $(date +%s) - start )) s"; grep -hE "^built|rror" "$OUT/build128.log" "$OUT/build256.log" | head -20
timeout 250 $V256 2>&1 | grep -v "^ptxas\|bytes stack\|^ *$" | tee "$OUT/v256.log"
timeout 150 $V128 2>&1 | grep -v "^ptxas\|bytes stack\|^ *$" | tee "$OUT/v128.log"
