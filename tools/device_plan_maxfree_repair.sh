#!/bin/bash
# Branch exp/fwd-max-free-repair, variants only (no package build), about 7 minutes (12 variant builds).
# Main skips the block-max search in non-causal kernels (hdim 64 / 128 / 256 except hdim 256's
# short-keys persistent kernel); when some p of a warpgroup would exceed the slack it computes S
# again. That repair made causal tiles 6 % slower (the diagonal block gives the top rows a max
# over few keys) and hdim 256's short-keys persistent kernel 20 % slower at 512 (its first block
# visited holds 32 keys: 512 = 6 x 80 + 32). rp (FLASH_FWD_DEV_MAX_FREE=1 on every kernel, with
# FLASH_FWD_DEV_MAX_FREE_REPAIR=1): a warp whose p exceed the slack repairs its rows from p
# (block max of p, the row's max moved by its log2, p and the sum divided by it; no second S);
# only overflowing p (inf/NaN) still need S again. Predictions: causal hdim 64 / 128 / 256 +2-5 %
# from 2k (at least equal to main at 512); hdim 256 non-causal 512 back to >= main; non-causal
# elsewhere equal to main's max-free kernels (+-1 %).
# Also hdim 96 and 192 non-causal (not measured with max-free blocks: off on main), mf (the
# second-S repair, as main's) and rp: prediction +3-6 % from 2k, like hdim 64/128.
# The variants' checks now include sliding windows (rows whose first visited block is masked).
#   run: bash tools/device_plan_maxfree_repair.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PYTHONPATH || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
v() { echo "python3 tools/variants.py --hdim $1 --rounds 3 --causal 0,1 --seqlens 512,2048,8192 --variant main$1 \
  --variant rp$1:FLASH_FWD_DEV_MAX_FREE=1,FLASH_FWD_DEV_MAX_FREE_REPAIR=1"; }
V64="$(v 64)"; V128="$(v 128)"; V256="$(v 256)"
w() { echo "python3 tools/variants.py --hdim $1 --rounds 3 --causal 0 --seqlens 512,2048,8192 --variant main$1 \
  --variant mf$1:FLASH_FWD_DEV_MAX_FREE=1 --variant rp$1:FLASH_FWD_DEV_MAX_FREE=1,FLASH_FWD_DEV_MAX_FREE_REPAIR=1"; }
V96="$(w 96)"; V192="$(w 192)"
start=$(date +%s)
$V64 --build-only > "$OUT/build64.log" 2>&1 &
$V128 --build-only > "$OUT/build128.log" 2>&1 &
$V256 --build-only > "$OUT/build256.log" 2>&1 &
$V96 --build-only > "$OUT/build96.log" 2>&1 &
$V192 --build-only > "$OUT/build192.log" 2>&1
wait
echo "built in $(( $(date +%s) - start )) s"; grep -hE "^built|rror" "$OUT"/build*.log | head -20
grep -h -A2 "Compiling entry" "$OUT"/build*.log | grep -E "spill" | sort | uniq -c | head
rm -f "$OUT"/build*.log
for V in "$V128" "$V64" "$V256" "$V96" "$V192"; do
  timeout 100 $V 2>&1 | grep -v "^ptxas\|bytes stack\|^ *$\|resource_tracker\|warnings.warn\|^built" | tee -a "$OUT/v.log"
done
