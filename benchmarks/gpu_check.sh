#!/usr/bin/env bash
# Issue 35's GPU checks in one go, on a machine with a GPU, PyTorch and the service's dependencies
# (docs/progress-api.md): what reporting costs a GPU loop (the loss a CUDA tensor), then the GPU
# campaign of real runs reported live to flowsched serve --no-kube.
#   [MATRIX=gpu2] bash benchmarks/gpu_check.sh OUT [WORK] [WORKERS] [DEADLINE_S]
# OUT: the printed results and a tarball of the runs; WORKERS runs share the GPU at a time.
set -u
out=${1:?usage: gpu_check.sh OUT [WORK] [WORKERS] [DEADLINE_S]}
work=${2:-/tmp/flowsched-gpu}
workers=${3:-8}
deadline=${4:-230}
py=${PYTHON:-python3}
matrix=${MATRIX:-gpu}  # gpu2: the second session's matrix
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1
{ nvidia-smi -L; $py -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee "$out/gpu.txt"
timeout 110 $py -m benchmarks.client_cost --device cuda --torch-python "$py" --rounds 8 --steps 1500 2>&1 | tee "$out/client_cost_gpu.txt"
timeout $((deadline + 60)) $py -m benchmarks.gpu_runs run --matrix "$matrix" --out "$work/gpu" --python "$py" --workers "$workers" --deadline-s "$deadline" 2>&1 | tee "$out/gpu_runs.txt"
tail -n 30 "$work"/gpu/worker*.log > "$out/workers_tail.txt" 2>&1
tar czf "$out/gpu_runs.tgz" -C "$work" gpu
ls -la "$out"
