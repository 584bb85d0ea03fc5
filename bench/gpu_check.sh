#!/usr/bin/env bash
# GPU validation at canonical size (issue: GPU validation on a lent H200). Needs PyTorch and/or
# JAX with CUDA and NumPy; nothing else of fxtrack's dependencies. Results go to $OUT.
# Budget (--all), aimed at ~10 minutes on an H200 (not yet measured on one): per framework one
# matmul calibration (<= 60 s), 9 jobs x (5 warm-up + 20 timed steps + compile), <= 5 fit probes
# (1 + 3 steps each) and, with a second GPU, one 2-GPU ResNet-50 run; --timeout caps each job.
set -euo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-gpu-results}" CUDA_DEVICE_ORDER=PCI_BUS_ID XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
python bench/gpu_check.py --all --frameworks "${FRAMEWORKS:-torch,jax}" --steps 20 --warmup 5 --timeout 100
