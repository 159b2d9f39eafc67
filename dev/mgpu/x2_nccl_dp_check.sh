#!/usr/bin/env bash
# Two H200s: data parallel over NCCL, one process per GPU (RANK/WORLD_SIZE/LOCAL_RANK set the way
# torchrun does, NCCL unique id through LONGTUNE_RENDEZVOUS), against one process with the same global batch.
# Runs from a device pack laid out like .dev-final (binaries in .dev-final/bin, libs in .dev-libs).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/x2"
mkdir -p /tmp/ltlibs && tar xJf .dev-libs/libs.tar.xz -C /tmp/ltlibs
export LD_LIBRARY_PATH=/tmp/ltlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
bin=.dev-final/bin/longtune; o=$OUT/x2
{
nvidia-smi --query-gpu=index,name --format=csv,noheader
t=$(mktemp -d); mkdir -p $t/data
python3 tests/cli/tiny_model.py $t/model --hidden 128 --layers 2 --bf16 || exit 1
for i in $(seq 1 48); do echo "{\"text\": \"record $i: the quick brown fox jumps over the lazy dog $i times\"}"; done > $t/data/train.jsonl
head -6 $t/data/train.jsonl > $t/data/valid.jsonl
args=(--device cuda --model $t/model --data $t/data --batch-size 4 --grad-accum 2 --max-seq-length 64 --iters 6
      --learning-rate 2e-3 --steps-per-report 1 --steps-per-eval 3 --val-batches -1 --save-every 3 --seed 7)
timeout 30 $bin train "${args[@]}" --distributed off --adapter-path $o/train_off > $o/train_off.log 2>&1; echo "off rc=$?"
export LONGTUNE_RENDEZVOUS=$t/nccl.id
for r in 0 1; do
  CUDA_VISIBLE_DEVICES=$r RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 timeout 40 $bin train "${args[@]}" --distributed nccl --adapter-path $o/train_nccl2 > $o/train_nccl2_rank$r.log 2>&1 &
done
wait; echo "nccl2 done"; tail -3 $o/train_nccl2_rank0.log; tail -3 $o/train_nccl2_rank1.log
grep -h "gradient buckets\|rank\|device" $o/train_nccl2_rank0.log | head -5
python3 tests/cli/compare_runs.py $o/train_off $o/train_nccl2; echo "compare rc=$?"
} 2>&1 | tee $o/run.log
find "$OUT" -type f -size +1M -delete
tar czf /tmp/round.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/round.tgz "$OUT/round.tgz"
