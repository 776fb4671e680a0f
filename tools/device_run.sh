#!/bin/bash
# One call on the GPU machine: install carried wheels, build the selected kernels in place,
# then run whatever command follows (tests, benchmarks). Logs land in $OUT.
#   HDIMS=128 DTYPES=bf16 bash tools/device_run.sh python3 tools/fwd_check.py
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/flash_attn_hopper_out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PYTHONPATH || exit 1
fi
# BG_CMD: something to build beside the main build (e.g. tools/variants.py --build-only ...).
if [ -n "$BG_CMD" ]; then (bash -c "$BG_CMD" > "$OUT/bg.log" 2>&1 &); fi
# ptxas -v: spills and "Potential Performance Loss" (wgmma serialized, C7511 / C7515) reach the log.
export FLASH_ATTN_HOPPER_VERBOSE_PTXAS=${FLASH_ATTN_HOPPER_VERBOSE_PTXAS:-1}
export FLASH_ATTN_HOPPER_HDIMS=${HDIMS:-128} FLASH_ATTN_HOPPER_DTYPES=${DTYPES:-bf16} MAX_JOBS=${MAX_JOBS:-16}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader | tee "$OUT/gpu.txt"
start=$(date +%s)
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
rc=$?
echo "build rc=$rc in $(( $(date +%s) - start )) s"
grep -E "error|compile time|s  |Performance Loss" "$OUT/build.log" | cut -c1-400 | tail -25
[ $rc -eq 0 ] || { tail -60 "$OUT/build.log"; exit $rc; }
export PYTHONPATH=$PWD:$PYTHONPATH
"$@"
