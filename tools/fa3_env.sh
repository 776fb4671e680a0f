# Sourced by the device plans that time FlashAttention-3 (device_plan.sh with FA3=1,
# device_plan_fa3.sh, device_plan_fa3_ncu.sh): FA3 builds in the background beside our build
# (tools/fa3_peer.py, run by device_run.sh's BG_CMD), importable from $FA3_DIR; $FA3_DONE appears,
# holding the build's exit status, when that build has ended. fa3_wait (exported, so the plans'
# inner shells have it) waits for it, up to $FA3_WAIT seconds (300), and reports.
export FA3_DIR=/tmp/fa3peer
export FA3_DONE=/tmp/fa3peer.rc
export PYTHONPATH=$FA3_DIR${PYTHONPATH:+:$PYTHONPATH}
rm -f "$FA3_DONE"
export BG_CMD="python3 tools/fa3_peer.py build --out $FA3_DIR --jobs ${FA3_JOBS:-8}; echo \$? > $FA3_DONE"
fa3_wait() {
  local waited=0
  while [ ! -f "$FA3_DONE" ] && [ $waited -lt "${FA3_WAIT:-300}" ]; do sleep 2; waited=$((waited + 2)); done
  echo "FA3 build rc=$(cat "$FA3_DONE" 2>/dev/null || echo timeout) after ${waited} s more"
  grep -E "built in|rror" "$OUT/bg.log" 2>/dev/null | cut -c1-300 | tail -12
}
export -f fa3_wait
