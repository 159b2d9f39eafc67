#!/usr/bin/env bash
# Device round (one H200): the NCCL transport of lt_comm in a world of one rank (test_cuda_comm),
# then data-parallel training of a CUDA model through NCCL (--distributed nccl: gradient buckets,
# staged loss sums) against the same run without a communicator: the trajectories must agree.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
{
echo "=== info $(date -u +%T) commit $(cat COMMIT)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if ldd ./test_cuda_comm | grep -q "libnccl.* not found"; then
  # No libnccl beside the toolkit: use the one PyTorch ships.
  d=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
  [ -n "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
  echo "libnccl from $d"
fi
ldd ./longtune | grep -E "nccl|not found"
echo "=== test_cuda_comm $(date -u +%T)"
NCCL_DEBUG=WARN timeout 6 ./test_cuda_comm; echo "rc=$?"
echo "=== train --device cuda, --distributed off vs nccl $(date -u +%T)"
bash dev/mgpu/nccl_train_check.sh ./longtune "$OUT" cuda; echo "check rc=$?"
echo "=== end $(date -u +%T)"
} 2>&1 | tee "$OUT/run.log"
