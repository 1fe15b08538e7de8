#!/usr/bin/env bash
# The one prepared device run (issues 9 and 30): benchmarks/gpu_check.py's stages in one command of
# at most 9 minutes on an H200-class machine (16 cores, 128 GB RAM). From a session that has a device
# (call `status` first: can_start_another), through the device tool:
#
#   run(command="bash scripts/device_check.sh", carry=[".whl", "engine/native/_mdk.cpython-311-x86_64-linux-gnu.so"],
#       timeout_s=590)
#
# then copy the report into the repository:  cp <files_at>/gpu_check-*.{json,md,png} benchmarks/results/
# The stages' estimates add up to ~600 s (benchmarks/gpu_check.py), so a first run leaves out the last
# ones, the 12 GB cards. Run them (or any stage that failed) at once after, while the machine is warm
# (it goes back after 30 s idle); arguments pass through to gpu_check.py:
#   run(command="bash scripts/device_check.sh --only mixtral_12gb,qwen3_12gb --budget-s 200",
#       carry=[".whl", "engine/native/_mdk.cpython-311-x86_64-linux-gnu.so"], timeout_s=260)
# A second run writes the same file names in its own $OUT: keep the first run's files before it.
#
# What travels. The image has torch 2.11 (CUDA 13), transformers 5.17, safetensors, tokenizers, accelerate,
# nvidia-ml-py, psutil, jinja2, packaging, numpy, pyyaml, requests, tqdm, pytest and matplotlib. Of
# pyproject's dependencies it lacks bitsandbytes (gpu-4: NF4), gguf (the GGUF stage, and engine/files/gguf's
# imports) and platformdirs (the profile caches); starlette and uvicorn serve the local API only, which no
# stage starts. Those three travel as wheels in .whl/ (git-ignored), fetched here (PyPI is reachable here,
# not there): 41.1 MiB bitsandbytes (its CUDA 13.0 library included), 0.1 MiB gguf, 0.1 MiB platformdirs:
#   rm -rf .whl && python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl bitsandbytes==0.50.2 gguf==0.19.0 platformdirs==4.14.9
#   du -ch .whl/*.whl | tail -1      # with the tree (~5 MiB) and the library, under the tool's 64 MiB
# The native CPU kernels (engine/native) are a plain C library loaded with ctypes (no Python ABI tie),
# built here by `pip install -e .` or `python setup.py build_ext --inplace`; it travels in carry (1.4 MiB,
# GLIBC 2.34 at most). Where it is missing or does not load there, it is built there (~5 s on 16 cores).
#
# Everything lands in $OUT (at most 8 files come back): gpu_check-<date>.json, .md and .png, log.txt,
# nvidia-smi.txt. The script stops itself inside its --budget-s (510 s by default), stage by stage,
# and `timeout` below is the net under it; each stage's result is in the report as soon as it ends.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mixdesk-gpu-check}
mkdir -p "$OUT"
started=$(date +%s)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
native_loads() {  # the library is there, loads, and has the struct layout engine/native/__init__.py expects
  python3 - <<'EOF'
import ctypes, glob, re, sys
want = int(re.search(r"^ABI = (\d+)", open("engine/native/__init__.py").read(), re.M).group(1))
for lib in sorted(glob.glob("engine/native/_mdk*.so")):
    try:
        sys.exit(0 if ctypes.CDLL(lib).mdk_abi() == want else 1)
    except (OSError, AttributeError):
        pass
sys.exit(1)
EOF
}
if ! native_loads && command -v cc >/dev/null; then
  echo "building the native CPU kernels here" | tee "$OUT/log.txt"
  python3 setup.py -q build_ext --inplace -j "$(nproc)" 2>&1 | tail -3 | tee -a "$OUT/log.txt"
fi
export XDG_CACHE_HOME=/tmp/mixdesk-cache
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
echo "setup took $(( $(date +%s) - started )) s" | tee -a "$OUT/log.txt"
timeout 530 python3 benchmarks/gpu_check.py --out "$OUT" --budget-s 510 "$@" 2>&1 | tee -a "$OUT/log.txt"
