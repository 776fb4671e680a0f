#!/bin/bash
# Backward check and kernel tests for head dims 96/128/192 in fp16 and bf16, plus the registry
# tests in one process (their order under xdist once mattered). About 2.5 minutes.
#   run: bash tools/device_plan_fp16_hdims.sh      (carry .whl)
set -o pipefail
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
export EXTRA_CMD="timeout 150 python3 tools/bwd_check.py --hdims 96,128,192 --dtypes fp16,bf16 > \$OUT/bwd_check.log 2>&1; echo \"bwd_check exit \$?\"; grep -v '^ok' \$OUT/bwd_check.log | tail -20; grep -c '^ok' \$OUT/bwd_check.log;
  timeout 150 python3 -m pytest -p no:xdist -p no:cacheprovider tests/test_torch_registry_cpu.py tests/test_torch_registry_gpu.py -q --log-level=DEBUG > \$OUT/regorder.log 2>&1; echo \"regorder exit \$?\"; tail -5 \$OUT/regorder.log;
  timeout 200 python3 -m pytest tests/test_flash_bwd.py tests/test_flash_fwd.py -q -n 8 -p no:cacheprovider > \$OUT/kerneltests.log 2>&1; echo \"kerneltests exit \$?\"; tail -5 \$OUT/kerneltests.log"
HDIMS=96,128,192 DTYPES=fp16,bf16 STEPS=cmd CMD_TIMEOUT=460 bash tools/device_session.sh
