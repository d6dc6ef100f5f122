#!/usr/bin/env bash
# The whole GPU check in one command (docs/gpu.md "Running the GPU checks"), from the
# repository root of a machine with a CUDA device, torch (CUDA build), pytest and pybind11:
#
#   bash benchmarks/gpu_session.sh [OUTDIR]
#
# Builds the core with CMake into build/gpu (no CUDA needed at build time), makes a package tree
# over the sources in build/gpu/pkg, prints what byteps sees (doctor), runs the device tests
# (fake device, then CUDA: tests/test_device.py, tests/test_device_nccl.py, tests/test_gpu.py,
# tests/test_gpu_nccl.py) and the GPU benchmark. Logs and results go to OUTDIR (default
# ${OUT:-/tmp/bps-gpu}): build.log, doctor.txt, pytest.txt, bench.txt, gpu.json, trace/ (the
# timelines of a traced 2-process job and trace/step.png).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR=${1:-${OUT:-/tmp/bps-gpu}}
PY=${PYTHON:-python}
mkdir -p "$OUTDIR"
cd "$ROOT"
B=build/gpu
echo "== build" | tee "$OUTDIR/build.log"
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$(command -v $PY)" \
  -Dpybind11_DIR="$($PY -m pybind11 --cmakedir)" >>"$OUTDIR/build.log" 2>&1 &&
  cmake --build $B -j"$(nproc)" --target _core >>"$OUTDIR/build.log" 2>&1 ||
  { echo "build failed:"; tail -40 "$OUTDIR/build.log"; exit 1; }
P=$B/pkg/byteps
rm -rf $B/pkg && mkdir -p $P
for f in "$ROOT"/core/*; do b=$(basename "$f"); [ "$b" = cpp ] || [ "$b" = __pycache__ ] || ln -s "$f" $P/$b; done
for fw in torch tensorflow mxnet; do ln -s "$ROOT/adapters/$fw" $P/$fw; done
ln -s "$ROOT/server" $P/server
ln -s "$ROOT"/$B/_core*.so $P/
export PYTHONPATH="$ROOT/$B/pkg${PYTHONPATH:+:$PYTHONPATH}"
echo "== doctor"; $PY -m byteps.doctor 2>&1 | tee "$OUTDIR/doctor.txt"
$PY -c "import torch, byteps; print('torch', torch.__version__, torch.version.cuda, \
torch.cuda.get_device_name(0)); print(byteps.cuda_status())" 2>&1 | tee -a "$OUTDIR/doctor.txt"
echo "== tests"
$PY -m pytest tests/test_device.py tests/test_device_nccl.py tests/test_gpu.py \
  tests/test_gpu_nccl.py -v -rs -p no:cacheprovider 2>&1 |
  tee "$OUTDIR/pytest.txt" | grep -E "PASS|FAIL|SKIP|ERROR|passed|failed"
echo "== benchmark"
$PY -m benchmarks.gpu --json "$OUTDIR/gpu.json" --trace "$OUTDIR/trace" 2>&1 | tee "$OUTDIR/bench.txt"
