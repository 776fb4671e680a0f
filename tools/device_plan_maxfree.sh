#!/bin/bash
# Branch exp/fwd-max-free, variants only (no package build), about 5 minutes.
# 1. mf (FLASH_FWD_DEV_MAX_FREE=1): key blocks after a tile's first compute p with the current
#    row max and skip the max search (32-44 FMNMX + a quad reduction per row and thread) while
#    every p stays within the lazy rescale's slack, checked on each thread's partial row sums; a
#    warp that fails computes S again and takes the max. ncu (hdim 64 causal, 2026-11-30):
#    FMNMX is 10-15 % of the instructions and 9-14 % of the stall samples. Prediction: hdim 64
#    +2-5 %, hdim 128 +1-3 %, hdim 256 +0-2 %.
# 2. s3 / s4 (FLASH_FWD_DEV_FORCE_STAGES): hdim 64 with 3 or 4 K/V stages. ncu at causal 512:
#    consumers wait for K ~8 % of the stall samples (2 stages, 2.5 key blocks per tile).
#    Prediction: causal 512-2k +2-5 %, long keys within 1 %.
#   run: bash tools/device_plan_maxfree.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PYTHONPATH || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
# The first call (2026-11-30) hung in mf's checks: the vote was per warp, but the WGMMA that
# computes S again is a warpgroup instruction; the vote is now a bar.red over the warpgroup.
# Variant sets: the forced stages first (no new code), then mf in sets of its own, each with its
# own timeout, so a hang costs only its set.
VS="python3 tools/variants.py --hdim 64 --rounds 3 --causal 0,1 --seqlens 512,1024,2048,8192 --variant b64 \
  --variant s3_64:FLASH_FWD_DEV_FORCE_STAGES=3 --variant s4_64:FLASH_FWD_DEV_FORCE_STAGES=4"
VM64="python3 tools/variants.py --hdim 64 --rounds 3 --causal 0,1 --seqlens 512,2048,8192 --variant b64m \
  --variant mf64:FLASH_FWD_DEV_MAX_FREE=1 --variant mfs3_64:FLASH_FWD_DEV_MAX_FREE=1,FLASH_FWD_DEV_FORCE_STAGES=3"
VM128="python3 tools/variants.py --hdim 128 --rounds 3 --causal 0,1 --seqlens 512,2048,8192 --variant b128 \
  --variant mf128:FLASH_FWD_DEV_MAX_FREE=1"
start=$(date +%s)
$VS --build-only > "$OUT/builds.log" 2>&1 &
$VM64 --build-only > "$OUT/build64.log" 2>&1 &
$VM128 --build-only > "$OUT/build128.log" 2>&1
wait
echo "built in $(( $(date +%s) - start )) s"; grep -hE "^built|rror" "$OUT"/build*.log | head -20
rm -f "$OUT"/build*.log
timeout 130 $VS 2>&1 | grep -v "^ptxas\|bytes stack\|^ *$\|resource_tracker\|warnings.warn" | tee "$OUT/vs.log"
timeout 100 $VM64 2>&1 | grep -v "^ptxas\|bytes stack\|^ *$\|resource_tracker\|warnings.warn" | tee "$OUT/vm64.log"
timeout 100 $VM128 2>&1 | grep -v "^ptxas\|bytes stack\|^ *$\|resource_tracker\|warnings.warn" | tee "$OUT/vm128.log"
