#!/bin/bash
# Branch exp/bwd-split-steps (adoption candidate): the causal backward's steps (RS path, head
# dims <= 128) in alternating masked / unmasked loops, now the default. Measured in the eighth
# session with the macro (3 rounds, x cuDNN, causal, 1k / 8k): hdim 64 0.905 / 0.901 -> 0.935 /
# 0.952, hdim 128 0.961 / 1.018 -> 0.962 / 1.026; gradient checks passed (default mode only).
# This plan runs the full suite (deterministic mode included) and the grid on it: if the suite
# passes and the grid's causal backward at hdim 64 / 128 is not below main's (0.87-0.96x
# cuDNN), merge it. About 5.5 minutes.
#   run: git checkout exp/bwd-split-steps && bash tools/device_plan_bwd_split_steps.sh      (carry .whl)
bash tools/device_plan.sh
