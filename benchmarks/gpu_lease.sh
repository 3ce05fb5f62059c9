#!/usr/bin/env bash
# What a lent GPU machine runs, in one go (it is lent for minutes): the SFT benchmark with posttrain's GPU
# defaults, the same with FlexAttention on padding-free rows of 32, and the GPU tests. Logs go to $OUT.
#
# Prepared here, in the checkout (the machine has torch, transformers, accelerate, peft; nothing can be
# downloaded there): wheels for Python 3.12 of trl, transformers, datasets, liger-kernel, torchx 0.7.0 and
# their missing needs, and posttrain's own, in .whl/ (ignored by git, carried):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl trl==1.16.0 transformers==5.24.0 datasets liger-kernel \
#     torchx==0.7.0 docstring-parser dill multiprocess pydantic pydantic-core annotated-types \
#     typing-inspection 'importlib-metadata<10'  # 10 needs lazy_importer
#   pip wheel --no-deps --no-build-isolation -w .whl .
# then: run(command="bash benchmarks/gpu_lease.sh", carry=[".whl"], timeout_s=560)
set -uo pipefail
out=${OUT:-/tmp/gpu-lease}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/machine.txt"
python3 -c "import torch, transformers, trl, liger_kernel, torchx.cli.main; print('torch', torch.__version__, 'transformers',
  transformers.__version__, 'trl', trl.__version__)" | tee -a "$out/machine.txt" || exit 1

sft() {  # name, then benchmark arguments
  local name=$1
  shift
  timeout 170 python3 -m benchmarks.sft --gpu --nproc 1 --repeats 1 --steps 30 --work /tmp/bench \
    --json "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "== $name (exit $?)"
  grep -E "^\| (tokens_per_s|first_step_s|peak_rss_mb|final_loss) |^MFU|ratio" "$out/$name.log"
}
sft sft-defaults
sft sft-flex-packed32 --override model.attn_implementation=flex_attention training.padding_free=true \
  training.max_length=null training.per_device_train_batch_size=32 --plain per_device_train_batch_size=32

timeout 200 python3 -m pytest -m "gpu and not vllm" -p no:cacheprovider -q \
  tests/e2e/test_distributed.py tests/e2e/test_online.py > "$out/pytest-gpu.log" 2>&1
echo "== pytest -m 'gpu and not vllm' (exit $?)"
tail -5 "$out/pytest-gpu.log"
