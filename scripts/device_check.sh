#!/usr/bin/env bash
# The one prepared device run (issue 9, and the gpu-marked VRAM-hog test of issue 6). From a session
# that has a device (call `status` first), through the device tool:
#   run(command="bash scripts/device_check.sh", carry=[".whl"], timeout_s=540)
# The device image has torch, transformers, pytest, pynvml, matplotlib; bitsandbytes and platformdirs
# travel as wheels in .whl/ (fetch them here first, see benchmarks/README or the closing notes):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 -d .whl bitsandbytes==0.50.2 platformdirs
# Everything lands in $OUT: gpu_check.json, gpu_check.png, log.txt, nvidia-smi.txt.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mixdesk-gpu-check}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export XDG_CACHE_HOME=/tmp/mixdesk-cache
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
timeout 500 python3 benchmarks/gpu_check.py --out "$OUT" --settings 4 "$@" 2>&1 | tee "$OUT/log.txt"
