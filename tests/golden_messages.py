"""User-visible messages that more than one test asserts, each written once here (a test elsewhere asserts it
by name). Most messages are asserted in one place only, the table or test of their concern; BAD_INPUTS, the bad
input at submit and its message, is asserted in process and (a sample) through the real CLI."""

from typing import List

# the misspelt training key the tests use, and its message
TYPO_OVERRIDE = "training.learnig_rate=1"
TYPO_MESSAGE = "training.learnig_rate: unknown key; did you mean training.learning_rate?"
NO_NODES = "-j '0x1': node and process counts must be at least 1"
BATCH_OF_ZERO = "training.per_device_train_batch_size: 0 is out of range; expected per_device_train_batch_size >= 1 (examples per process and step)"
DEEPSPEED_IS_OWNED = "training.deepspeed: set by posttrain, not in training; use distributed.deepspeed"
VLLM_MODE_WITHOUT_VLLM = "training.vllm_mode: server does nothing with use_vllm: false"
REFERENCE_WITH_LORA = "reference_model: not used with model.lora"
REWARD_WEIGHTS_ARE_OWNED = "training.reward_weights: set by posttrain, not in training; use rewards[].weight"
UNKNOWN_VLLM_MODE = "training.vllm_mode: expected one of 'colocate', 'server'; got 'remote'"
PPO_WITH_LORA = "model.lora: posttrain's PPO trains full weights"
MODEL_KEY_TYPO = "model.dtyp: unknown key; did you mean model.dtype?"
DATA_KEY_TYPO = "data.train.paht: unknown key; did you mean data.train.path?"
KEY_IN_THE_WRONG_SECTION = "model.learning_rate: unknown key here; it belongs at training.learning_rate"
NOT_A_NUMBER = "training.learning_rate: expected a number; got 'fast'"
ZERO_STEPS = "training.max_steps: must be positive, or -1 to train by epochs; got 0"
NOT_A_BOOLEAN = "model.trust_remote_code: input should be a valid boolean"
ZERO_TIMEOUT = "distributed.timeout_s: must be positive; got 0"
BF16_AND_FP16 = "training.bf16, training.fp16: at most one can be true"
MINI_BATCHES_NOT_DIVIDING = "training.num_mini_batches: 3 must divide per_device_train_batch_size (16)"
MORE_MIN_THAN_MAX_NODES = "-j '3:2x1': the minimum node count 3 exceeds the maximum 2"

# (component, extra CLI arguments, what the one-line message must say)
BAD_INPUTS = [
    # component arguments
    ("sft", ["-j", "2x"], "-j '2x': expected [MIN:]NNODESxNPROC"),
    ("sft", ["-j", "0x1"], NO_NODES),
    ("sft", ["-j", "1x0"], "-j '1x0': node and process counts must be at least 1"),
    ("sft", ["-j", "3:2x1"], MORE_MIN_THAN_MAX_NODES),
    ("sft", ["-j", "two"], "-j 'two': expected"),
    ("sft", ["--tee", "5"], "--tee 5: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"),
    ("sft", ["--rdzv_port", "0"], "--rdzv_port 0: expected a TCP port in 1..65535"),
    ("sft", ["--rdzv_port", "70000"], "--rdzv_port 70000: expected a TCP port in 1..65535"),
    ("sft", ["--rdzv_backend", "zk"], "--rdzv_backend 'zk': expected one of c10d, static, etcd, etcd-v2"),
    ("sft", ["--max_retries", "-1"], "--max_retries -1: must be 0 or more"),
    ("sft", ["--max_restarts", "-2"], "--max_restarts -2: must be 0 or more"),
    ("sft", ["--memMB", "0"], "--memMB 0: must be positive"),
    ("sft", ["--cpu", "0"], "--cpu 0: must be at least 1"),
    ("sft", ["-h", "gpu.nope"], "-h 'gpu.nope': unknown named resource"),
    ("sft", ["--mounts", "type=magic"], "--mounts type=magic"),
    ("sft", ["--env", "HF_TOKEN=hf_abc"], "--env HF_TOKEN: looks like a secret"),
    ("sft", ["--env", "WANDB_API_KEY=abc"], "--env WANDB_API_KEY: looks like a secret"),
    # the spec file
    ("sft", ["--spec", "templates/sft/missing.yaml"], "--spec: no such file: templates/sft/missing.yaml"),
    ("sft", ["--spec", "{broken_yaml}"], "is not valid YAML"),
    ("sft", ["--spec", "{list_yaml}"], "must hold a mapping of sections"),
    ("dpo", ["--spec", "templates/sft/tiny.yaml"], "algorithm: this spec is for 'sft' but was given to posttrain.dpo"),
    ("sft", ["algorithm=sfft"], "algorithm: unknown 'sfft'; expected one of"),
    # unknown and misplaced keys, at every level
    ("sft", [TYPO_OVERRIDE], TYPO_MESSAGE),
    ("sft", ["model.dtyp=auto"], MODEL_KEY_TYPO),
    ("sft", ["data.train.paht=x.jsonl"], DATA_KEY_TYPO),
    ("sft", ["model.learning_rate=1"], KEY_IN_THE_WRONG_SECTION),
    ("sft", ["trainig.max_steps=1"], "trainig: unknown key; did you mean training?"),
    ("sft", ["distributed.timeout=5"], "distributed.timeout: unknown key; did you mean distributed.timeout_s?"),
    ("sft", ["model.lora.rnk=8"], "model.lora.rnk: unknown key"),
    # keys the package owns
    (
        "sft",
        ["training.deepspeed=ds.json"],
        DEEPSPEED_IS_OWNED,
    ),
    (
        "sft",
        ["training.use_cpu=true"],
        "training.use_cpu: set by posttrain, not in training; posttrain sets it from the hardware",
    ),
    (
        "sft",
        ["training.ddp_timeout=10"],
        "training.ddp_timeout: set by posttrain, not in training; use distributed.timeout_s",
    ),
    (
        "sft",
        ["training.resume_from_checkpoint=x"],
        "training.resume_from_checkpoint: set by posttrain, not in training; use resume",
    ),
    ("sft", ["training.hub_token=hf_x"], "training.hub_token: set by posttrain, not in training; it is a secret"),
    # wrong types and out-of-range values
    ("sft", ["training.learning_rate=fast"], NOT_A_NUMBER),
    ("sft", ["training.max_steps=2.5"], "training.max_steps: expected an integer; got '2.5'"),
    ("sft", ["training.bf16=maybe"], "training.bf16: expected true/false or null; got 'maybe'"),
    ("sft", ["training.lr_scheduler_type=cosin"], "training.lr_scheduler_type: expected one of"),
    (
        "sft",
        ["training.per_device_train_batch_size=0"],
        BATCH_OF_ZERO,
    ),
    ("sft", ["training.learning_rate=-1"], "training.learning_rate: -1.0 is out of range; expected learning_rate > 0"),
    ("sft", ["training.max_steps=0"], ZERO_STEPS),
    (
        "sft",
        ["model.dtype=bf16"],
        "model.dtype: input should be 'auto', 'float32', 'bfloat16' or 'float16'; got 'bf16'",
    ),
    ("sft", ["model.trust_remote_code=maybe"], NOT_A_BOOLEAN),
    ("sft", ["distributed.timeout_s=0"], ZERO_TIMEOUT),
    ("sft", ["resume= "], "resume: expected auto, never or a checkpoint path"),
    # impossible combinations and hardware
    ("sft", ["training.bf16=true", "training.fp16=true"], BF16_AND_FP16),
    ("sft", ["model.dtype=float16", "training.bf16=true"], "model.dtype: float16 contradicts training.bf16: true"),
    ("sft", ["data.train.name=org/set"], "data.train: give exactly one of path"),
    ("sft", ["-h", "cpu.small", "training.fp16=true"], "training.fp16: -h cpu.small has no GPU"),
    ("sft", ["--launcher", "mpirun"], "--launcher 'mpirun': expected one of torchrun, deepspeed"),
    ("sft", ["--launcher", "deepspeed", "-j", "1:2x1"], "-j 1:2x1: DeepSpeed's launcher runs a fixed number of nodes"),
    ("sft", ["--launcher", "deepspeed", "--max_restarts", "2"], "--max_restarts 2: worker restarts are torchrun's"),
    (
        "sft",
        ["-h", "cpu.small", "distributed.fsdp={}"],
        "distributed.fsdp: -h cpu.small has no GPU, and accelerate runs FSDP on GPUs only",
    ),
    (
        "sft",
        ["distributed.fsdp={}", "distributed.deepspeed={zero_stage: 2}"],
        "distributed: deepspeed and fsdp both shard the model",
    ),
    # batch arithmetic and algorithm-specific settings
    (
        "grpo",
        ["training.num_generations=3"],
        "training.num_generations: the generation batch (16 = 8 per device x 2 processes x 1 steps) must divide by num_generations (3)",
    ),
    ("grpo", ["rewards.0.builtin=nope"], "rewards.0.builtin: unknown built-in reward 'nope'"),
    (
        "grpo",
        ["training.reward_weights=[1.0]"],
        REWARD_WEIGHTS_ARE_OWNED,
    ),
    ("grpo", ["training.vllm_mode=remote"], UNKNOWN_VLLM_MODE),
    (
        "ppo",
        ["training.num_mini_batches=3"],
        MINI_BATCHES_NOT_DIVIDING,
    ),
    ("ppo", ["model.lora={r: 8}"], PPO_WITH_LORA),
    ("dpo", ["reference_model=org/ref", "model.lora={r: 8}"], REFERENCE_WITH_LORA),
    # QLoRA: an adapter on 4-bit weights, with data parallelism
    ("sft", ["model.quantization=4bit"], "model.quantization: 4bit weights are frozen; add model.lora"),
    (
        "sft",
        ["model.quantization=4bit", "model.lora={r: 8}", "distributed.deepspeed={zero_stage: 2}"],
        "model.quantization: posttrain does not shard quantized weights with distributed.deepspeed",
    ),
    ("sft", ["model.quantization=8bit"], "model.quantization: input should be '4bit'; got '8bit'"),
    ("ppo", ["model.quantization=4bit"], "model.quantization: posttrain's PPO trains full weights"),
    # malformed overrides
    ("sft", ["training.max_steps"], "override 'training.max_steps': expected key.path=value"),
    ("sft", ["training.max_steps.x=3"], "training.max_steps is a value, not a section"),
    # posttrain loads every model itself; the new algorithms' own keys
    (
        "grpo",
        ["training.trust_remote_code=true"],
        "training.trust_remote_code: set by posttrain, not in training; use model.trust_remote_code",
    ),
    (
        "dpo",
        ["training.model_init_kwargs={dtype: bfloat16}"],
        "training.model_init_kwargs: set by posttrain, not in training; posttrain loads the models",
    ),
    (
        "distill",
        ["training.teacher_model_name_or_path=x"],
        "training.teacher_model_name_or_path: set by posttrain, not in training; use teacher_model",
    ),
    ("distill", ["teacher_model= "], "teacher_model: expected a path or hub id; got an empty string"),
    (
        "online_dpo",
        ["training.reward_model_path=x"],
        "training.reward_model_path: set by posttrain, not in training; use rewards",
    ),
    ("online_dpo", ["rewards=[]"], "rewards: give at least one reward"),
    ("online_dpo", ["reference_model=org/ref", "model.lora={r: 8}"], REFERENCE_WITH_LORA),
]


def resolve(args: List[str], broken_specs: dict, component: str) -> List[str]:
    """A row's arguments as ``torchx run`` gets them: ``{broken_yaml}`` and ``{list_yaml}`` are conftest's
    ``broken_specs``, and the component's tiny template is the spec unless the row gives one."""
    args = [broken_specs.get(a.strip("{}"), a) for a in args]
    return args if "--spec" in args else ["--spec", f"templates/{component}/tiny.yaml", *args]
