#!/bin/bash
# Issue 60's daemon on a lent 4-GPU node, read-only: probes on all four GPUs (llm/vit/attention/train every
# 60 s) while a seeded trace of users' jobs comes and goes on GPU 1; then the interconnect probe across
# the four GPUs and `gpuperfd check --quick`. No cap, clock or mode is changed; NVLink multicast off.
set -u
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
Q="index,name,power.limit,power.default_limit,enforced.power.limit,clocks.max.sm,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/limits_before.txt
nvidia-smi topo -m > $OUT/topo.txt
timeout 380 python3 benchmarks/busy_node.py --gpus 0,1,2,3 --busy-gpu 1 --probes llm,vit,attention,train --interval 60 \
  --seconds 290 --idle 10 --gaps 10,60 --jobs 10,40 --seed 72 --no-kubelet --state-dir /tmp/gq4 \
  --json $OUT/busy_node.json --keep $OUT/daemon.log > $OUT/busy.out 2>&1
timeout 90 python3 -m gpuperfd probe interconnect --gpus 0,1,2,3 --json > $OUT/interconnect.json 2> $OUT/interconnect.err
echo "interconnect exit $?" >> $OUT/interconnect.err
timeout 60 python3 -m gpuperfd check --quick > $OUT/check.txt 2>&1; echo "check exit $?" >> $OUT/check.txt
nvidia-smi --query-gpu=$Q --format=csv > $OUT/limits_after.txt
cat $OUT/limits_before.txt $OUT/limits_after.txt; grep -E '"(fitting_gaps|fitting_gaps_with_result|max_yield_seconds)"' $OUT/busy_node.json; tail -3 $OUT/interconnect.err; tail -8 $OUT/check.txt
