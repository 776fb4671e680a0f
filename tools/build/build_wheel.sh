#!/usr/bin/env bash
# Build a flash_attn_hopper wheel against the torch of the current Python environment: the one
# route that maintainers, .ci/run and .github/workflows/wheels.yml all use.
#
#   tools/build/build_wheel.sh [--minimal] [--local-version auto|LABEL] [--out DIR]
#
# It packs an sdist first and builds the wheel from that sdist, outside the checkout, so a wheel
# can only contain what the sdist ships (and every wheel build proves that the sdist builds).
# Both land in DIR (default: dist/ of the checkout); the last line printed is the wheel's path.
#
#   --minimal            CI's kernel set: FLASH_ATTN_HOPPER_HDIMS=128 FLASH_ATTN_HOPPER_DTYPES=bf16
#                        (forward, backward, paged forward: 4 files); default: the knobs in the environment,
#                        else every head dim and dtype.
#   --local-version X    append +X to the version ("auto": cu<CUDA> of this torch, e.g. 0.1.0+cu130),
#                        so the wheels for several CUDA majors can sit side by side in one release.
#                        (The binding uses torch's stable ABI: a wheel is not tied to one torch.)
#   --out DIR            where the sdist and the wheel go.
#
# Environment: PYTHON (default: python3), and the build knobs of setup.py / the README: MAX_JOBS,
# CUDA_HOME, CUTLASS_HOME, FLASH_ATTN_HOPPER_HDIMS, FLASH_ATTN_HOPPER_DTYPES,
# FLASH_ATTN_HOPPER_DISABLE_BACKWARD. The environment must already have torch, setuptools, wheel,
# ninja and nvidia-cutlass (or CUTLASS_HOME): the extension compiles against that torch, so the
# build runs without isolation. The full build log is kept next to the wheel (build-wheel.log).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
PYTHON=${PYTHON:-python3}
OUT=$REPO/dist
LOCAL=""
while [ $# -gt 0 ]; do
  case "$1" in
    --minimal) export FLASH_ATTN_HOPPER_HDIMS=128 FLASH_ATTN_HOPPER_DTYPES=bf16; shift ;;
    --local-version) LOCAL=${2:?--local-version needs a value}; shift 2 ;;
    --out) OUT=${2:?--out needs a directory}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build_wheel.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd -P)

if [ "$LOCAL" = auto ]; then
  LOCAL=$("$PYTHON" -c 'import torch; print("cu" + (torch.version.cuda or "cpu").replace(".", ""))')
fi
if [ -n "$LOCAL" ]; then export FLASH_ATTN_HOPPER_LOCAL_VERSION=$LOCAL; fi

"$PYTHON" -c 'import torch, setuptools, wheel' 2>/dev/null || {
  echo "build_wheel.sh: $PYTHON lacks torch, setuptools or wheel; install them first (see the README)" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/fah-wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
LOG=$OUT/build-wheel.log
echo "build_wheel.sh: $("$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'),"\
  "kernels: hdims=${FLASH_ATTN_HOPPER_HDIMS:-all} dtypes=${FLASH_ATTN_HOPPER_DTYPES:-all}"\
  "backward=$([ -n "${FLASH_ATTN_HOPPER_DISABLE_BACKWARD:-}" ] && echo off || echo on)"\
  "MAX_JOBS=${MAX_JOBS:-default}${LOCAL:+, local version $LOCAL}"

# 1. the sdist, through setuptools' PEP 517 hook (no torch, toolkit or CUTLASS needed for it)
(cd "$REPO" && "$PYTHON" -c 'import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))' \
  "$WORK" > "$WORK/sdist.name" 2> "$WORK/sdist.log") || { cat "$WORK/sdist.log" >&2; echo "build_wheel.sh: sdist FAILED" >&2; exit 1; }
SDIST=$WORK/$(tail -n 1 "$WORK/sdist.name")
cp "$SDIST" "$OUT/"
echo "build_wheel.sh: sdist $(basename "$SDIST") ($(du -k "$SDIST" | cut -f1) KiB)"

# 2. the wheel from the sdist, against this environment's torch
start=$(date +%s)
if ! (cd "$WORK" && "$PYTHON" -m pip wheel --no-build-isolation --no-deps -v -w "$WORK/wheel" "$SDIST") > "$LOG" 2>&1; then
  tail -n 150 "$LOG" >&2
  echo "build_wheel.sh: wheel build FAILED after $(( $(date +%s) - start )) s (full log: $LOG)" >&2
  exit 1
fi
grep -E "^ *flash_attn_hopper: |^ +[0-9.]+ s  " "$LOG" | sed "s/^  //" || true
WHEEL=$(ls "$WORK"/wheel/flash_attn_hopper-*.whl)
cp "$WHEEL" "$OUT/"
WHEEL=$OUT/$(basename "$WHEEL")
echo "build_wheel.sh: built in $(( $(date +%s) - start )) s: $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KiB)"
echo "$WHEEL"
