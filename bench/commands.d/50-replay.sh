# Replay and scale (BENCHMARKS.md "Trace replay and scale"). Traces are read
# from $SHARED; a missing trace is skipped with the reason.
set -euo pipefail
ali="$SHARED/traces/alibaba-gpu-v2023"
if [ -r "$ali/openb_pod_list_default.csv" ]; then
  "$TOPOSCHED" replay --trace alibaba-openb --nodes "$ali/openb_node_list_gpu_node.csv" \
    --jobs "$ali/openb_pod_list_default.csv" --hold --limit 3000 --compare aware,blind --report "$OUT/alibaba-hold"
else
  echo "skip alibaba-openb: $ali/openb_pod_list_default.csv not found"
fi
itp="$SHARED/traces/microsoft-itp/cluster01.csv"
if [ -r "$itp" ]; then
  "$TOPOSCHED" replay --trace itp --jobs "$itp" --cluster deploy/examples/replay/dgx-a100-512.yaml \
    --compare aware,blind --report "$OUT/itp-cluster01"
  # What users feel against peers' strategies (BENCHMARKS.md, issue 17).
  "$TOPOSCHED" replay --trace itp --jobs "$itp" --cluster deploy/examples/replay/hetero-512.yaml \
    --compare aware,blind,binpack,spread,gpuallocator,random --policies none --report "$OUT/itp-cluster01-hetero"
else
  echo "skip itp: $itp not found"
fi
"$TOPOSCHED" replay --trace synthetic --gpus 1024 --count 1000 --seed 1 --compare aware,blind --report "$OUT/synthetic-1k"
# Who has the lowest mean JCT over generated traces (BENCHMARKS.md, "twenty
# generated traces"), three of the twenty seeds, to stay in budget.
"$TOPOSCHED" replay --trace synthetic --cluster deploy/examples/replay/hetero-512.yaml --count 1500 --load 1.1 \
  --whole-nodes 0 --sizes 1:70,2:4,4:6,8:14,16:3,32:2,64:1 --duration-median 2h --duration-sigma 1.5 \
  --seeds 1-3 --compare aware,blind,binpack,spread,gpuallocator,random --policies none --no-progress
"$TOPOSCHED" scale --gpus 1000,10000 --burst 1000 --report "$OUT/scale"
