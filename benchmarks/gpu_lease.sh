#!/usr/bin/env bash
# What a lent GPU machine runs, in one go (it is lent for minutes, 15 in all with the machine's start): the pending
# GPU proofs, in order of value, within GPU_BUDGET_S (480 s) of wall time. By default: the rollout generator against
# transformers' generate at GRPO's GSM8K-like step, GRPO's and RLOO's whole steps against TRL's scripts at that step,
# the shipped SFT template against the SFT benchmark, QLoRA's peak memory against bf16 LoRA's (1.5B's shape), and
# the GPU end-to-end tests. Each case's expected seconds on an H100 are in `expected` below: a case that would not
# finish in what is left of the budget is skipped (said in one line), one that runs over is stopped at the budget,
# and every case that finished keeps its logs and figures in $OUT. Name cases to run others, or those skipped, in a
# second call (the measured ones too: attention, defaults, defaults-as-posttrain, 1.5b-defaults, grpo-1.5b,
# grpo-rows, grpo-micro, grpo-liger). `bash benchmarks/gpu_lease.sh --plan [case ...]` prints the cases, their
# expected seconds and what fits, on any machine, and runs nothing.
#
# Prepared here, in the checkout (the machine has torch, transformers, accelerate, peft; nothing can be
# downloaded there): wheels for Python 3.12 of trl, transformers, datasets, liger-kernel, torchx 0.7.0,
# bitsandbytes and their missing needs, and posttrain's own, in .whl/ (ignored by git, carried):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl trl==1.16.0 transformers==5.24.0 datasets liger-kernel \
#     torchx==0.7.0 docstring-parser dill multiprocess pydantic pydantic-core annotated-types \
#     typing-inspection 'importlib-metadata<10'  # 10 needs lazy_importer
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_24_x86_64 -d .whl bitsandbytes==0.50.2
#   # 43 MB, over the carry limit with the rest: keep the CUDA 13 library the machine's torch (cu130) loads
#   zip -q -d .whl/bitsandbytes-*.whl 'bitsandbytes/libbitsandbytes_cuda1[12]*.so' 'bitsandbytes/libbitsandbytes_rocm*'
#   pip wheel --no-deps --no-build-isolation -w .whl .
# then: run(command="bash benchmarks/gpu_lease.sh", carry=[".whl"], timeout_s=560)
set -uo pipefail
# each case's expected seconds on an H100 (from BENCHMARKS.md's runs; the rollout generator's and RLOO's estimated)
declare -A expected=(
  [rollout]=150 [grpo]=240 [rloo]=240 [template]=70 [lora-1.5b]=60 [qlora-1.5b]=60 [e2e]=90
  [attention]=30 [defaults]=90 [defaults-as-posttrain]=90 [1.5b-defaults]=100 [grpo-1.5b]=300 [grpo-rows]=200
  [grpo-micro]=240 [grpo-liger]=200
)
budget=${GPU_BUDGET_S:-480}
plan=0
if [[ ${1:-} == --plan ]]; then
  plan=1
  shift
fi
# the cases, in the order they run; name some to run only those: bash benchmarks/gpu_lease.sh grpo e2e
cases=(${@:-rollout grpo rloo template lora-1.5b qlora-1.5b e2e})
for case in "${cases[@]}"; do
  [[ -n ${expected[$case]:-} ]] || { echo "unknown case $case (known: ${!expected[*]})" >&2; exit 2; }
done
if ((plan)); then
  planned=0
  for case in "${cases[@]}"; do
    if ((planned + expected[$case] <= budget)); then
      planned=$((planned + expected[$case]))
      echo "$case: ${expected[$case]} s"
    else
      echo "$case: ${expected[$case]} s, skipped: over the budget (run it in a second call)"
    fi
  done
  echo "planned: ${planned} s of ${budget} s (GPU_BUDGET_S), on an H100"
  exit 0
fi
out=${OUT:-/tmp/gpu-lease}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# --force-reinstall: a warm machine keeps the last call's posttrain, whose version a rebuilt wheel shares
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --force-reinstall .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/machine.txt"
python3 -c "import torch, transformers, trl, liger_kernel, torchx.cli.main; print('torch', torch.__version__, 'transformers',
  transformers.__version__, 'trl', trl.__version__)" | tee -a "$out/machine.txt" || exit 1
python3 -c "import inspect; from torch.nn.attention.varlen import varlen_attn; print('varlen_attn', inspect.signature(varlen_attn))" \
  2>&1 | tail -1 | tee -a "$out/machine.txt"

bench() {  # name, benchmark (sft, grpo), then its arguments
  local name=$1 algorithm=$2
  shift 2
  timeout "$BENCH_TIMEOUT" python3 -m "benchmarks.$algorithm" --gpu --nproc 1 --repeats 1 --steps 30 --work /tmp/bench \
    --json "$out/$name.json" --keep "/tmp/keep-$name" "$@" > "$out/$name.log" 2>&1
  echo "== $name (exit $?)"
  grep -E "^\| (tokens_per_s|loop_tokens_per_s|first_step_s|peak_rss_mb|peak_gpu_mb|final_\w+) |^MFU|ratio|^$algorithm:|^  \w+ +run " \
    "$out/$name.log"
  local job=/tmp/keep-$name/1proc/posttrain-0  # what posttrain's job said and ran (fast_paths), not its weights
  cp "$job/output/run_summary.json" "$out/$name-run_summary.json" 2>/dev/null
  tail -c 100000 "$job/run.log" > "$out/$name-posttrain.log" 2>/dev/null
  grep -A6 '"fast_paths"' "$out/$name-run_summary.json" 2>/dev/null | tr -d ' \n'; echo
  rm -rf "/tmp/keep-$name"
}
gpu_tests() {  # name, then pytest arguments
  local name=$1
  shift
  timeout "$BENCH_TIMEOUT" python3 -m pytest -m "gpu and not vllm" -p no:cacheprovider -q "$@" > "$out/$name.log" 2>&1
  echo "== $name (exit $?)"
  tail -5 "$out/$name.log"
}
# LoRA's and QLoRA's runs: the same adapter and batch (gpu_batch would fill what 4-bit weights free)
lora=("model.lora={r: 16, lora_alpha: 32, target_modules: all-linear}" training.per_device_train_batch_size=8)
for case in "${cases[@]}"; do
  left=$((budget - SECONDS))
  if ((expected[$case] > left)); then
    echo "== $case skipped: expected ${expected[$case]} s, ${left} s of the budget left"
    continue
  fi
  # a case stops at the budget's end, whatever its own bound
  export BENCH_TIMEOUT=$left
  case $case in
    # the rollout generator against generate, 256 rows of up to 512 tokens ending as RL's do, interleaved
    rollout) timeout "$left" python3 -m benchmarks.rollout_generator --gpu --repeats 1 --workloads spread \
      --json "$out/rollout.json" > "$out/rollout.log" 2>&1
      echo "== rollout (exit $?)"
      grep -E "^\| |rollout / generate" "$out/rollout.log" ;;
    # first the kernels' own check: if torch's varlen attention fails here, the SFT rows say what that costs
    attention) gpu_tests pytest-attention tests/unit/speed/test_attention.py ;;
    # each side's defaults: posttrain's (torch_varlen, padding-free, Liger, the batch the GPU holds) and TRL's
    defaults) bench sft-defaults sft ;;
    # the plain script given posttrain's batch, Liger and checkpointing: what is left is packing and attention
    defaults-as-posttrain) bench sft-defaults-as-posttrain sft \
      --plain per_device_train_batch_size=64 use_liger_kernel=true activation_checkpointing=false ;;
    1.5b-defaults) bench sft-1.5b-defaults sft --model 1.5b ;;
    # the shipped template, given only the benchmark's model, data and length: its tokens/s within 10% of defaults'
    template) bench sft-template sft --sides posttrain --template templates/sft/qwen2.5-0.5b.yaml ;;
    # the peak GPU memory of QLoRA (4-bit weights) below bf16 LoRA's, both training (final loss below the first)
    lora-1.5b) bench sft-1.5b-lora sft --model 1.5b --sides posttrain --steps 10 --override "${lora[@]}" ;;
    qlora-1.5b) bench sft-1.5b-qlora sft --model 1.5b --sides posttrain --steps 10 --override "${lora[@]}" \
      model.quantization=4bit ;;
    # GRPO and RLOO at a GSM8K-like step (32 prompts x 8 completions of up to 512 tokens; benchmarks/grpo.py)
    # against TRL's scripts: generation and the training loop timed apart; 4 steps of each side about 4 minutes.
    # RL_SIDES=posttrain runs one side (where the other's figures are on this card already)
    grpo | rloo) bench "$case" "$case" --steps "${RL_STEPS:-4}" \
      --sides ${RL_SIDES:-posttrain trl} ;;
    grpo-1.5b) bench "$case" grpo --model 1.5b --steps "${RL_STEPS:-4}" \
      --sides ${RL_SIDES:-posttrain trl} ;;
    # the same step's 256 rows in one micro-batch (0.5B's fit an H100 with checkpointing): the loop's MFU at full rows
    grpo-rows) bench "$case" grpo --steps "${RL_STEPS:-3}" --sides posttrain \
      --override training.per_device_train_batch_size=256 "~training.gradient_accumulation_steps" ;;
    # a step whose rows would not fit, split by the job (fast_paths.micro_batches): 1.5B's 256 rows without
    # activation checkpointing, as 8 micro-batches of 32 on an H100; the job's line says the split, fast_paths lists it
    grpo-micro) bench "$case" grpo --model 1.5b --steps "${RL_STEPS:-3}" \
      --sides posttrain --override training.per_device_train_batch_size=256 "~training.gradient_accumulation_steps" \
      training.activation_checkpointing=false
      grep -h "micro-batches of" "$out/$case-posttrain.log" ;;
    # posttrain's GRPO with Liger's layer kernels (not its default since they slowed its steps on an H200)
    grpo-liger) bench "$case" grpo --steps "${RL_STEPS:-4}" --sides posttrain \
      --override training.use_liger_kernel=true ;;
    e2e) gpu_tests pytest-gpu tests/e2e/test_distributed.py tests/e2e/test_online.py ;;
  esac
done
