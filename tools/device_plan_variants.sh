#!/bin/bash
# One device call that builds variant sets side by side while the main extension builds, then
# checks and times each set (tools/variants.py). The device_plan_*.sh experiment plans call it.
#   bash tools/device_plan_variants.sh "<variants.py arguments common to all sets>" "<set>" ["<set>" ...]
# A set is the rest of a variants.py command line, e.g. "--hdim 256 --variant b --variant p:KEY=1".
# HDIMS (the main extension's head dims, default 128) and CMD_TIMEOUT (default 330 s) pass through.
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
V="python3 tools/variants.py $1"
shift
build="" run=""
for set in "$@"; do
  build+="$V $set --build-only & "
  run+="$V $set; "
done
HDIMS=${HDIMS:-128} STEPS=cmd CMD_TIMEOUT=${CMD_TIMEOUT:-330} \
  BG_CMD="${build}wait; touch \$OUT/bg.done" \
  EXTRA_CMD="while [ ! -e \$OUT/bg.done ]; do sleep 2; done; grep -E 'built|rror' \$OUT/bg.log; $run" \
  bash tools/device_session.sh
