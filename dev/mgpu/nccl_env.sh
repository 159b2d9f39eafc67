# Sourced by the device scripts: when libnccl is not beside the CUDA toolkit, use the one PyTorch
# ships (nvidia.nccl), as scripts/gpu-bench.sh does.
if ldd ./longtune 2>/dev/null | grep -q "libnccl.* not found"; then
  d=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
  [ -n "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && echo "libnccl from $d"
fi
