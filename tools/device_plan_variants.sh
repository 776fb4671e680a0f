#!/bin/bash
# Experiment variants only (no main build), each set bounded by a timeout; output in
# $OUT/persist.log. Third session: forward base vs persistent vs persistent + own O buffer (found
# the second-tile hang, then measured the non-causal win). Next:
# - backward hdim 64 with 128 query rows per step (FLASH_BWD_DEV_BLOCK_M=128; ptxas: ~180 B of
#   spills), checked, then timed with and without deterministic mode;
# - backward deterministic causal in descending key-block order (FLASH_BWD_DEV_DET_DESCENDING=1),
#   checked in both modes (causal, window, top-left), then timed;
# - forward causal with the grouped heaviest-first tile order (tile_scheduler.h);
#   FLASH_FWD_PERSISTENT=1 makes both masks persistent.
#   run: bash tools/device_plan_variants.sh      (carry .whl; about 7-8 minutes)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
V="python3 tools/variants.py"
FWD128="--hdim 128 --variant q128 --variant q128p:FLASH_FWD_PERSISTENT=1 --variant q128po:M=128,N=128,S=2,FLASH_FWD_PERSISTENT=1,FLASH_FWD_DEV_SEPARATE_O=1"
FWD64="--hdim 64 --variant q64 --variant q64p:FLASH_FWD_PERSISTENT=1 --variant q64po:FLASH_FWD_PERSISTENT=1,FLASH_FWD_DEV_SEPARATE_O=1"
BWD64="--bwd --hdim 64 --variant w64 --variant w64m:FLASH_BWD_DEV_BLOCK_M=128"
BWD128D="--bwd --hdim 128 --variant e128 --variant e128d:FLASH_BWD_DEV_DET_DESCENDING=1"
{ $V $FWD128 --build-only & $V $FWD64 --build-only & $V $BWD64 --build-only & $V $BWD128D --build-only & wait; } 2>&1 \
  | grep -E "built|rror" > $OUT/persist.log
timeout 100 $V $BWD128D --deterministic --causal 1 --seqlens 2048,8192 2>&1 | grep -v "^ptxas\|bytes\|^ok" >> $OUT/persist.log; echo "bwd128 det exit $?" >> $OUT/persist.log
timeout 120 $V $BWD64 --deterministic --seqlens 512,2048,8192 2>&1 | grep -v "^ptxas\|bytes\|^ok" >> $OUT/persist.log; echo "bwd64 exit $?" >> $OUT/persist.log
timeout 75 $V $FWD128 --seqlens 512,2048,8192 2>&1 | grep -v "^ptxas\|bytes" >> $OUT/persist.log; echo "fwd128 exit $?" >> $OUT/persist.log
timeout 75 $V $FWD64 --seqlens 512,2048,8192 2>&1 | grep -v "^ptxas\|bytes" >> $OUT/persist.log; echo "fwd64 exit $?" >> $OUT/persist.log
cat $OUT/persist.log
