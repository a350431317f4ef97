#!/usr/bin/env bash
# The GPU power report's run as one script of a wave (lab/gpu/wave.sh power:BUDGET_S): lab/gpu/offload_runs.sh
# power-all into RESULT_DIR, every shard cut 90 s before BUDGET_S so the joins still run.
#
#   bash lab/gpu/power.sh RESULT_DIR        from the checkout's root, after the vLLM 0.33.0 bundle install and
#                                           cosmic-ray's (POWER_SITE, default $HOME/power-site)
#
# POWER_GROUPS: the region groups (default "kernel": the group whose test command changed since the H200 run of
# results/power-gpu-h200.md; "offload kernel" for both). Exit status: offload_runs.sh's; 2 on bad input.
set -uo pipefail
out=${1:-}
[ -n "$out" ] || { echo "power.sh: usage: bash lab/gpu/power.sh RESULT_DIR" >&2; exit 2; }
budget=${BUDGET_S:-1200}
[[ $budget =~ ^[0-9]+$ && $budget -ge 300 ]] || { echo "power.sh: BUDGET_S is whole seconds, at least 300" >&2; exit 2; }
ls -d "${POWER_SITE:-$HOME/power-site}"/cosmic_ray >/dev/null 2>&1 ||
    { echo "power.sh: no cosmic-ray in POWER_SITE=${POWER_SITE:-$HOME/power-site} (bash .gpu/power/part1/install.sh \$HOME/power-site)" >&2; exit 2; }
mkdir -p "$out"
OUT=$out POWER_GROUPS=${POWER_GROUPS:-kernel} POWER_SHARD_TIMEOUT_S=$((budget - 90)) \
    bash "$(dirname "$0")/offload_runs.sh" power-all
