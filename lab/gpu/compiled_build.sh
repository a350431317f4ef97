#!/usr/bin/env bash
# lab/gpu/compiled.sh's two builds alone (STOP_AFTER=build), with the architecture read from nvidia-smi, so that no
# CUDA context is made: it can run beside lab/gpu/faults.sh, which needs the GPU to itself. The legs then run from a
# later `bash lab/gpu/compiled.sh DIR` with the same STATE (a wave: compiled_build:400 faults:300 -- compiled:600 ...).
#
#   bash lab/gpu/compiled_build.sh RESULT_DIR
set -uo pipefail
if [ -z "${ARCH:-}" ]; then
  ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
  [ -n "$ARCH" ] || { echo "compiled_build.sh: nvidia-smi gives no compute capability (set ARCH, e.g. 9.0)" >&2; exit 2; }
fi
ARCH=$ARCH STOP_AFTER=build exec bash "$(dirname "$0")/compiled.sh" "$@"
