#!/bin/bash
# The next GPU session's first call, ready to send (NOTES.md, "Next GPU session"): the main build
# (hdim 64/128/256 bf16, forward + backward) with the experiment variants building beside it, the
# full test suite, then the variants' checks and timings. Variant names are unique per call: two
# sets with one name would build into one folder at once.
#   run: bash tools/device_plan.sh      (carry .whl; about 8-9 minutes)
set -o pipefail
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
V="python3 tools/variants.py"
FWD128="--hdim 128 --variant a128 --variant a128p:FLASH_FWD_PERSISTENT=1 --variant a128po:M=128,N=128,S=2,FLASH_FWD_PERSISTENT=1,FLASH_FWD_DEV_SEPARATE_O=1"
FWD64="--hdim 64 --variant a64 --variant a64po:FLASH_FWD_PERSISTENT=1,FLASH_FWD_DEV_SEPARATE_O=1 --variant a64t:M=128,N=128,S=2"
BWD256="--bwd --hdim 256 --variant b256 --variant b256r:FLASH_BWD_DEV_ROTATE=1"
BWD64="--bwd --hdim 64 --variant b64 --variant b64r:FLASH_BWD_DEV_ROTATE=1 --variant b64kv:FLASH_BWD_DEV_KV_REGS=1"
export BG_CMD="$V $FWD128 --build-only & $V $FWD64 --build-only & $V $BWD256 --build-only & $V $BWD64 --build-only & wait; echo BGDONE"
export EXTRA_CMD="while ! grep -q BGDONE \$OUT/bg.log; do sleep 2; done; grep -E 'built|rror' \$OUT/bg.log;
  $V $BWD256 --seqlens 512,2048,8192 2>&1 | grep -v '^ok';
  $V $BWD64 --seqlens 512,2048,8192 2>&1 | grep -v '^ok';
  $V $FWD128 --seqlens 512,1024,2048,8192;
  $V $FWD64 --seqlens 512,1024,2048,8192"
HDIMS=64,128,256 STEPS=${STEPS:-pytest,cmd} TEST_TIMEOUT=${TEST_TIMEOUT:-180} CMD_TIMEOUT=${CMD_TIMEOUT:-300} \
  bash tools/device_session.sh
