#!/usr/bin/env bash
# Runs the tiny ZeRO-3 SFT N times (default 20) through torchx and counts runs that did not exit 0,
# to catch the intermittent SIGABRT at exit seen with DeepSpeed ZeRO-3 on CPU (issue: Distribution).
# Too slow for CI (about 20 s a run); run it once after changing the runtime's teardown:
#   bash benchmarks/zero3_exit_loop.sh [N]
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
work=$(mktemp -d)
failures=0
for i in $(seq "$runs"); do
  if torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny-zero3.yaml -j 1x2 \
      training.output_dir="$work/run-$i" training.max_steps=10 training.save_steps=5 > "$work/run-$i.log" 2>&1; then
    echo "run $i: ok"
    rm -rf "$work/run-$i" "$work/run-$i.log"
  else
    failures=$((failures + 1))
    echo "run $i: FAILED ($(grep -m1 -E 'SIGABRT|terminate called|Error' "$work/run-$i.log")); log: $work/run-$i.log"
  fi
done
echo "$((runs - failures)) passed, $failures failed"
[[ $failures == 0 ]] && rm -rf "$work"
[[ $failures == 0 ]]
