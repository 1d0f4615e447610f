#!/bin/bash
# Issue 60 on a lent 2-GPU H200 node, read-only, after rounds take a schedule due within a child's start:
# the daemon (both GPUs, llm/vit/attention/train every 60 s) while a seeded trace of users' jobs (gaps
# 10-60 s) comes and goes on GPU 1; then `gpuperfd check --quick`. No cap, clock or mode is changed.
set -u
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
Q="index,name,power.limit,power.default_limit,enforced.power.limit,clocks.max.sm,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/limits_before.txt
timeout 480 python3 benchmarks/busy_node.py --gpus 0,1 --busy-gpu 1 --probes llm,vit,attention,train --interval 60 \
  --seconds 400 --idle 10 --gaps 10,60 --jobs 10,40 --seed 71 --no-kubelet --state-dir /tmp/gq2 \
  --json $OUT/busy_node.json --keep $OUT/daemon.log > $OUT/busy.out 2>&1
timeout 60 python3 -m gpuperfd check --quick > $OUT/check.txt 2>&1; echo "check exit $?" >> $OUT/check.txt
nvidia-smi --query-gpu=$Q --format=csv > $OUT/limits_after.txt
cat $OUT/limits_before.txt $OUT/limits_after.txt; tail -45 $OUT/busy.out; tail -12 $OUT/check.txt
