#!/usr/bin/env bash
# The two-GPU context-parallel check (issue 30): examples/context_parallel_decode.py under
# torchrun on 2 GPUs of this host (NCCL): the MLA and GQA decodes of each rank's shard of the
# KV cache, all-gathered and merged with mlakit.merge_states, against one GPU's decode of the
# whole cache; a PASS / FAIL line per operation, the exit status nonzero on a failure.
# Usage (on the GPU machine, after a build into build-gpu, e.g. by scripts/gpu_check.sh):
#   bash scripts/cp_two_gpu.sh [example options...]        e.g. --seed 1 --b 8 --max-len 65536
# With OUT set, the log also goes to $OUT/cp_two_gpu.log.
set -uo pipefail
cd "$(dirname "$0")/.."
# NVLink multicast off in every process NCCL, PyTorch or NVSHMEM starts: on the shared GPU
# machines a program that uses it can put the host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/build-gpu/python${PYTHONPATH:+:$PYTHONPATH}"
if [ ! -d build-gpu/python/mlakit ]; then
  echo "cp_two_gpu: no mlakit package in build-gpu/python; build it first" \
       "(bash scripts/gpu_check.sh --skip-tests --skip-bench)" >&2
  exit 2
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$gpus" -lt 2 ]; then
  echo "cp_two_gpu: needs 2 GPUs, found $gpus" >&2
  exit 2
fi
log=/dev/null
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  log="$OUT/cp_two_gpu.log"
fi
torchrun --standalone --nproc_per_node=2 examples/context_parallel_decode.py --check "$@" 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
