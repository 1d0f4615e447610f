#!/bin/bash
# Issue 60, a lent 2-GPU H200 node, read-only: the child's import guard (A/B), ViT's regional compile
# against the whole-forward compile (A/B, cold and warm caches), vit qualify-to-result with the new build.
# Run from the repository root on the device machine: bash benchmarks/results/i60/h200x2-regional/run.sh
set -u
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
Q="index,name,power.limit,power.default_limit,enforced.power.limit,clocks.max.sm,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/limits_before.txt
nvidia-smi topo -m > $OUT/topo.txt
python3 -c "import torch, transformers, sys; print(sys.version, torch.__version__, transformers.__version__)" > $OUT/versions.txt 2>&1
python3 -c "import transformers, torch._dynamo" 2>/dev/null   # the page cache warm for both forms
for i in 1 2 3; do
  echo "=== round $i no-guard"; python3 benchmarks/diag/child_imports.py --no-guard llm | grep -E "^WALL|^CHAIN|self seconds"
  echo "=== round $i guard";    python3 benchmarks/diag/child_imports.py llm | grep -E "^WALL|^CHAIN|self seconds"
done > $OUT/imports.txt 2>&1
for v in --no-guard ""; do echo "=== vit compiled $v"; python3 benchmarks/diag/child_imports.py $v vit compiled | grep -E "^WALL|^CHAIN|self seconds"; done >> $OUT/imports.txt 2>&1
timeout 300 python3 benchmarks/diag/vit_regional.py --rounds 3 --json $OUT/vit_regional.json > $OUT/vit_regional.out 2>&1
timeout 200 python3 benchmarks/qualify_to_result.py --gpu 0 --probes vit --standby on --runs 3 --repeats 0 --state-dir /tmp/gq --json $OUT/q2r_vit.json > $OUT/q2r_vit.out 2>&1
nvidia-smi --query-gpu=$Q --format=csv > $OUT/limits_after.txt
cat $OUT/limits_before.txt $OUT/limits_after.txt; tail -3 $OUT/imports.txt; tail -4 $OUT/vit_regional.out; tail -15 $OUT/q2r_vit.out
