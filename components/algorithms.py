"""TorchX components for LLM post-training, one per algorithm (``torchx run posttrain.<algorithm>``).

Each validates a YAML spec plus ``key.path=value`` overrides and returns the AppDef ``appdef.py`` builds.
torchx needs each component as a real function with its own signature; what an algorithm is lives in
``registry.py``, the shared ``Args:`` block in ``arguments.py``.
"""

from typing import Dict, List, Optional

import torchx
import torchx.specs as specs

# modules, not their functions: torchx lints every function in this module as a component, on every run
from posttrain.components import appdef, arguments


@arguments.component
def sft(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
) -> specs.AppDef:
    """Supervised fine-tuning (trl.SFTTrainer) of a causal LM on chat or text data.

    Use it to teach a base model a format or a task from demonstrations, and as
    the first stage of an RLHF chain (SFT, then reward model, then PPO).
    ``training`` holds ``trl.SFTConfig`` fields; the job writes the model,
    ``trainer_state.json`` and ``run_summary.json`` to ``output_dir``.

    .. code-block:: shell-session

        $ torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml
        $ torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml -j 1x2 training.max_steps=20
        $ torchx run -s slurm posttrain.sft --spec templates/sft/qwen2.5-0.5b.yaml -j 2x8 -h gpu.h100.8
    """
    return appdef.build_appdef("sft", **locals())


@arguments.component
def dpo(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
) -> specs.AppDef:
    """Direct preference optimisation (trl.DPOTrainer) of a causal LM on chosen/rejected pairs.

    Use it after SFT to prefer chosen over rejected answers without a reward
    model. The data has ``prompt``/``chosen``/``rejected`` columns (or
    ``chosen``/``rejected``), as text or chat messages. The reference policy is
    a frozen copy of the model, or ``reference_model`` (a path or hub id); with
    ``model.lora`` it is the model with its adapter disabled. ``training``
    holds ``trl.DPOConfig`` fields; the job logs ``rewards/accuracies`` and
    ``rewards/margins``.

    .. code-block:: shell-session

        $ torchx run -s local_cwd posttrain.dpo --spec templates/dpo/tiny.yaml
        $ torchx run -s slurm posttrain.dpo --spec templates/dpo/ultrafeedback.yaml -j 2x8 -h gpu.h100.8
    """
    return appdef.build_appdef("dpo", **locals())


@arguments.component
def reward(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
) -> specs.AppDef:
    """Reward modelling (trl.RewardTrainer): a sequence-classification head scoring chosen above rejected.

    Use it to train the reward model of an RLHF chain (SFT, reward model, then
    PPO scored by it). The data has ``prompt``/``chosen``/``rejected`` columns
    (or ``chosen``/``rejected``). The model gets a one-label classification
    head; ``training`` holds ``trl.RewardConfig`` fields; the job logs
    ``accuracy`` and ``margin`` and saves a model that
    ``AutoModelForSequenceClassification`` loads.

    .. code-block:: shell-session

        $ torchx run -s local_cwd posttrain.reward --spec templates/reward/tiny.yaml
        $ torchx run -s slurm posttrain.reward --spec templates/reward/qwen2.5-0.5b.yaml -j 1x8 -h gpu.h100.8
    """
    return appdef.build_appdef("reward", **locals())


@arguments.component
def kto(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
) -> specs.AppDef:
    """Kahneman-Tversky optimisation (trl.KTOTrainer) from unpaired desirable/undesirable answers.

    Use it when feedback is a thumbs up or down per answer rather than a pair.
    The data has ``prompt``/``completion``/``label`` columns (``label`` true
    for desirable). The reference policy is as for DPO (a frozen copy,
    ``reference_model``, or the adapter-disabled model with LoRA);
    ``training`` holds ``trl.KTOConfig`` fields.

    .. code-block:: shell-session

        $ torchx run -s local_cwd posttrain.kto --spec templates/kto/tiny.yaml
        $ torchx run -s slurm posttrain.kto --spec templates/kto/qwen2.5-0.5b.yaml -j 1x8 -h gpu.h100.8
    """
    return appdef.build_appdef("kto", **locals())


@arguments.component
def orpo(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
) -> specs.AppDef:
    """Odds-ratio preference optimisation (trl.experimental.orpo.ORPOTrainer): SFT and preference in one loss.

    Use it to align a base model in one stage, with no reference model. The
    data has ``prompt``/``chosen``/``rejected`` columns (or
    ``chosen``/``rejected``); ``training`` holds ``ORPOConfig`` fields.

    .. code-block:: shell-session

        $ torchx run -s local_cwd posttrain.orpo --spec templates/orpo/tiny.yaml
        $ torchx run -s slurm posttrain.orpo --spec templates/orpo/qwen2.5-0.5b.yaml -j 1x8 -h gpu.h100.8
    """
    return appdef.build_appdef("orpo", **locals())


@arguments.component
def grpo(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
    vllm_h: Optional[str] = None,
    vllm_gpu: int = 0,
    vllm_replicas: int = 1,
    vllm_tp: int = 1,
) -> specs.AppDef:
    """Group relative policy optimisation (trl.GRPOTrainer); GSPO with importance_sampling_level: sequence.

    Use it to raise a reward on generated completions without a value model:
    each prompt gets ``num_generations`` completions, each scored against its
    group. The data has a ``prompt`` column; ``rewards`` lists user functions
    (``function: module:callable``), built-ins (``builtin: exact_match |
    contains | length_band | regex_format``) and reward models (``model:
    path``), each with a ``weight``. ``training`` holds ``trl.GRPOConfig``
    fields; with ``use_vllm`` and ``vllm_mode: server`` the job gets a
    ``vllm`` role (``--vllm_*``). The job logs ``reward``.

    .. code-block:: shell-session

        $ torchx run -s local_cwd posttrain.grpo --spec templates/grpo/tiny.yaml
        $ torchx run -s local_cwd posttrain.grpo --spec templates/grpo/tiny-vllm-server.yaml
        $ torchx run -s slurm posttrain.grpo --spec templates/grpo/gsm8k.yaml -j 2x8 -h gpu.h100.8
    """
    return appdef.build_appdef("grpo", **locals())


@arguments.component
def rloo(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
    vllm_h: Optional[str] = None,
    vllm_gpu: int = 0,
    vllm_replicas: int = 1,
    vllm_tp: int = 1,
) -> specs.AppDef:
    """REINFORCE leave-one-out (trl.RLOOTrainer): each completion's baseline is the mean of its group's others.

    Use it to raise a reward on generated completions without a value model,
    with an unbiased baseline: each prompt gets ``num_generations``
    completions, each scored against the mean reward of the others. The data
    has a ``prompt`` column; ``rewards`` lists user functions (``function:
    module:callable``), built-ins (``builtin: exact_match | contains |
    length_band | regex_format``) and reward models (``model: path``), each
    with a ``weight``. ``training`` holds ``trl.RLOOConfig`` fields; with
    ``use_vllm`` and ``vllm_mode: server`` the job gets a ``vllm`` role
    (``--vllm_*``). The job logs ``reward`` (each reward's as
    ``rewards/<name>/mean``), ``entropy`` and, with ``beta`` > 0, ``kl``.

    .. code-block:: shell-session

        $ torchx run -s local_cwd posttrain.rloo --spec templates/rloo/tiny.yaml
        $ torchx run -s slurm posttrain.rloo --spec templates/rloo/gsm8k.yaml -j 2x8 -h gpu.h100.8
    """
    return appdef.build_appdef("rloo", **locals())


@arguments.component
def ppo(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
) -> specs.AppDef:
    """Proximal policy optimisation with posttrain's own PPO trainer (TRL 1.x has none).

    Use it for classic RLHF: an SFT policy, a frozen reference, a value model
    and a reward (a reward model from ``posttrain.reward`` and/or functions),
    with a KL penalty (fixed or adaptive), GAE and clipped policy and value
    losses over several PPO epochs per rollout batch. The data has a
    ``prompt`` column; ``rewards`` lists reward models (``model: path``),
    user functions (``function: module:callable``) and built-ins, each with a
    ``weight``; ``training`` holds posttrain's ``PPOConfig``; ``value_model``
    defaults to the reward model. The job logs ``objective/scores``,
    ``objective/kl``, ``objective/kl_coef``, ``objective/non_score_reward``,
    ``objective/entropy``, ``loss/policy``, ``loss/value``,
    ``policy/approxkl``, ``policy/clipfrac``, ``val/clipfrac`` and
    ``val/explained_variance``, and saves the policy and ``value_model/``.

    .. code-block:: shell-session

        $ torchx run -s local_cwd posttrain.ppo --spec templates/ppo/tiny.yaml
        $ torchx run -s slurm posttrain.ppo --spec templates/ppo/tldr.yaml -j 1x8 -h gpu.h100.8
    """
    return appdef.build_appdef("ppo", **locals())


@arguments.component
def distill(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
) -> specs.AppDef:
    """On-policy distillation (trl.DistillationTrainer) of a teacher model into the trained model.

    Use it to pass a stronger model's behaviour to a smaller one of the same
    tokenizer: the student generates completions of the ``prompt`` column and
    learns the teacher's next-token distributions on them (generalised JSD,
    ``training.beta``). ``teacher_model`` (a path or hub id) is loaded like the
    model, frozen. ``training`` holds ``trl.DistillationConfig`` fields.

    .. code-block:: shell-session

        $ torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml
        $ torchx run -s local_cwd posttrain.distill --spec templates/distill/tiny.yaml
        $ torchx run -s slurm posttrain.distill --spec templates/distill/qwen2.5-1.5b-to-0.5b.yaml -j 1x8 -h gpu.h100.8
    """
    return appdef.build_appdef("distill", **locals())


@arguments.component
def online_dpo(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
    vllm_h: Optional[str] = None,
    vllm_gpu: int = 0,
    vllm_replicas: int = 1,
    vllm_tp: int = 1,
) -> specs.AppDef:
    """Online DPO (trl.experimental.online_dpo.OnlineDPOTrainer): preference pairs sampled and scored as it trains.

    Use it where you can score answers but have no preference data: the model
    samples two completions per ``prompt``, ``rewards`` score them (user
    functions, built-ins and reward models, each with a ``weight``), and
    DPO's loss prefers the better one against a frozen reference (the model
    itself, or ``reference_model``). ``training`` holds ``OnlineDPOConfig``
    fields; with ``use_vllm`` and ``vllm_mode: server`` the job gets a
    ``vllm`` role (``--vllm_*``). The job logs ``objective/scores``,
    ``objective/kl`` and ``rewards/margins``.

    .. code-block:: shell-session

        $ torchx run -s local_cwd posttrain.online_dpo --spec templates/online_dpo/tiny.yaml
        $ torchx run -s slurm posttrain.online_dpo --spec templates/online_dpo/qwen2.5-0.5b.yaml -j 1x8 -h gpu.h100.8
    """
    return appdef.build_appdef("online_dpo", **locals())


@arguments.component
def chain(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
) -> specs.AppDef:
    """A post-training chain in one job: named stages (SFT, reward model, PPO, DPO, ...) run in order on the
    same nodes, each handing its model to the next.

    The spec names the chain's ``output_dir`` and its ``stages``, each a spec
    (inline, or ``spec: <path>`` with sections to change);
    ``${stages.<name>.output}`` is an earlier stage's model. Every stage is
    checked before the job is submitted. Run the same command again after a
    kill or a preemption: finished stages are skipped and the stage it was in
    resumes from its newest checkpoint. Overrides address a stage:
    ``stages.<name>.<key.path>=value``.

    .. code-block:: shell-session

        $ torchx run -s local_cwd posttrain.chain --spec templates/chain/rlhf-tiny.yaml
        $ torchx run -s local_cwd posttrain.chain --spec templates/chain/sft-dpo-tiny.yaml stages.dpo.training.beta=0.2
    """
    return appdef.build_chain_appdef(**locals())
