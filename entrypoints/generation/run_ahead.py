"""How the trainers and the ``vllm`` role take turns: the role generating ahead of training (``generation.max_lag``
above 0, TRL's ``GRPOTrainer``), or in lockstep, timed.

In lockstep (TRL's own, ``max_lag: 0``) the trainers push their weights to the role, then wait while it
generates; the role waits while they train. Here, beside training:

- rank 0's *generator* thread sends the role, in order, the prompts of the next ``max_lag`` optimizer steps as soon
  as the trainers' data loader hands them out (:meth:`RunAhead.get_batch_samples` reads it ahead). It starts the
  batch of step ``s`` only once the role holds the weights of step ``s - max_lag`` or later: no sample is staler
  than the bound. Nothing is asked for past ``max_steps``: the trainers, not the role, decide when training ends;
- every ``weight_sync_steps`` steps the trainers push their weights into the role, in flight: vLLM's
  ``/pause?mode=keep`` freezes the requests it is running (none is aborted, none dropped), TRL's own weight sync
  runs (sharded weights gathered; on CPU a file the role reloads, on GPUs TRL's NCCL group: see
  ``vllm_generation``), the role drops its cache of the old weights, and ``/resume`` lets the requests go on,
  their tokens so far recomputed with the new weights.
  A completion may so span two policies; its version is the one its batch started with, the older.

Every batch carries its version; TRL's importance-sampling correction (``vllm_importance_sampling_*``) weighs each
sample by the trainer's and the sampler's log-probabilities. A role that leaves ``/health`` unanswered for
``weight_sync_timeout_s`` while the trainers wait, or that exits, ends the job in one line naming the role and the
step. What was generated ahead is not saved with a checkpoint (its count is, in ``trainer_state.json``): a resumed
run pushes the checkpoint's weights first, generates those batches again from them, and its summary says how many.

In lockstep, ``turns.Lockstep`` only times the trainers' wait, so that ``metrics.jsonl`` compares the two. In
both, a push that does not end within ``weight_sync_timeout_s`` ends the job in one line (``turns.Turns.deadline``).
"""

import collections
import copy
import dataclasses
import logging
import threading
import time
import types
from typing import Any, Deque, Dict, List, Optional, Tuple

import requests
from accelerate.utils import broadcast_object_list, gather_object
from transformers.trainer_callback import ExportableState

from posttrain.components.spec.generation import TrainingGeneration
from posttrain.components.spec.messages import SpecError, first_line
from posttrain.entrypoints.generation import role_lease
from posttrain.entrypoints.generation.turns import Lockstep, Turns, overdue_generation
from posttrain.entrypoints.generation.vllm_generation import count_generated

log = logging.getLogger("posttrain")

# how often the trainer, waiting for samples, looks at the generator and the role
WAIT_POLL_S = 0.05


@dataclasses.dataclass
class _Batch:
    """One generation batch on its way: the unique prompts of optimizer step ``step``, and what the role made."""

    step: int
    prompts: List[List[int]]
    output: Optional[Dict[str, Any]] = None
    # the policy version (optimizer step) of the weights the role held when it started the batch
    version: int = -1
    # when the role started and ended it (time.monotonic)
    started: float = 0.0
    ended: float = 0.0
    done: threading.Event = dataclasses.field(default_factory=threading.Event)


class RunAhead(Turns, ExportableState):
    """The trainer's generation, run ahead on the role (see the module's docstring); :func:`install` wires it."""

    def __init__(self, trainer: Any, schedule: TrainingGeneration) -> None:
        super().__init__(trainer, schedule)
        # micro-batches read from the data loader but not yet handed to the training loop
        self.ahead: Deque[Any] = collections.deque()
        # micro-batches read in all (TRL's _step counts them alike), and in this epoch, from its first step
        self.read = 0
        self.epoch: Tuple[Any, int, int] = (None, 0, 0)
        self.first_step = 0
        # rank 0: batches asked for, in order, and the next one the trainer takes
        self.batches: Deque[_Batch] = collections.deque()
        self.taken: Deque[_Batch] = collections.deque()
        self.role_version = -1
        # batches asked for ahead of the checkpoint resumed from, generated again
        self.regenerated = 0
        self.failure: Optional[SpecError] = None
        self.stopping = False
        self.generator: Optional[threading.Thread] = None

    # the training loop's side, every rank

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Tuple[List[Any], Any]:
        """Transformers' ``Trainer.get_batch_samples``, reading ``max_lag`` optimizer steps ahead: the prompts of
        each generation batch read go to the role at once (every rank reads in step: the prompts are gathered)."""
        trainer = self.trainer
        accumulation = trainer.args.gradient_accumulation_steps
        iterator, epoch_start, read_in_epoch = self.epoch
        if iterator is not epoch_iterator:
            # a new epoch starts a step (what was read ahead of the last was all handed out: it ended it)
            iterator, epoch_start, read_in_epoch = epoch_iterator, trainer.state.global_step, 0
        while len(self.ahead) < num_batches + self.schedule.max_lag * accumulation:
            step = epoch_start + read_in_epoch // accumulation
            if step >= trainer.state.max_steps:
                break
            try:
                batch = next(epoch_iterator)
            except StopIteration:
                break
            # TRL generates for every steps_per_generation-th micro-batch (num_iterations is 1: run_ahead_problems)
            if self.read % trainer.args.steps_per_generation == 0:
                self._ask(batch, step)
            self.read += 1
            read_in_epoch += 1
            self.ahead.append(batch)
        self.epoch = (iterator, epoch_start, read_in_epoch)
        batches = [self.ahead.popleft() for _ in range(min(num_batches, len(self.ahead)))]
        return batches, trainer._get_num_items_in_batch(batches, device)

    def _ask(self, batch: List[Dict[str, Any]], step: int) -> None:
        prompt_ids, images, _ = self.trainer._tokenize_prompts(copy.deepcopy([row["prompt"] for row in batch]))
        # every rank, before the collective: a data set's images are the same on all
        if images is not None or any("image" in row or "images" in row for row in batch):
            raise SpecError([f"generation.max_lag: {self.schedule.max_lag}: prompts with images generate in lockstep"])
        everyone = gather_object(prompt_ids)
        if self.main:
            asked = _Batch(step, everyone[:: self.trainer.num_generations])
            with self.changed:
                self.batches.append(asked)
                self.taken.append(asked)
                self.changed.notify_all()

    def generate_single_turn(
        self, prompt_ids: Any, images: Any, multimodal_fields: Any, num_generations: int, **_: Any
    ) -> Any:
        """TRL's ``_generate_single_turn`` in training: the batch the role generated ahead, as TRL's own would be."""
        trainer = self.trainer
        everyone = gather_object(prompt_ids)
        payload: Any = None
        if self.main:
            try:
                batch = self._take(everyone[::num_generations])
                payload = (batch.output["completion_ids"], batch.output["logprobs"], batch.version)
            except SpecError as error:
                # every rank ends with it, none waits in the collective
                payload = error
        payload = [payload]
        broadcast_object_list(payload, from_process=0)
        if isinstance(payload[0], SpecError):
            raise payload[0]
        completion_ids, logprobs, version = payload[0]
        staleness = trainer.state.global_step - version
        if not 0 <= staleness <= self.schedule.max_lag:
            raise RuntimeError(f"run-ahead: samples of version {version} at step {trainer.state.global_step}")
        self.count(staleness=staleness)
        rank = slice(
            trainer.accelerator.process_index * len(prompt_ids),
            (trainer.accelerator.process_index + 1) * len(prompt_ids),
        )
        # TRL keeps the sampled token's log-prob (the first of vLLM's top ones)
        return completion_ids[rank], [[top[0] for top in sequence] for sequence in logprobs[rank]]

    def _take(self, prompts: List[List[int]]) -> _Batch:
        """Rank 0: the next batch asked for, once the role made it; the job ends in one line if it cannot."""
        with self.changed:
            batch = self.taken.popleft()
        if batch.prompts != prompts:
            raise RuntimeError(f"run-ahead: the batch of step {batch.step} is not the one generated for it")
        started = answered = asked = time.monotonic()
        silent_s = self.schedule.weight_sync_timeout_s
        bound = self.schedule.generate_timeout(self.trainer.args.ddp_timeout)
        # the optimizer step it is trained in, as the log counts (batch.step is the global step it starts at)
        step = batch.step + 1
        while not batch.done.wait(WAIT_POLL_S):
            self._check()
            if batch.started and time.monotonic() - batch.started > bound:
                raise SpecError([overdue_generation(self._base_url, step, bound)])
            if time.monotonic() - asked > role_lease.POLL_S:
                asked = time.monotonic()
                if self._healthy():
                    answered = asked
                elif asked - answered > silent_s:
                    raise SpecError(
                        [
                            f"vllm role: the server at {self._base_url} has not answered /health for "
                            f"{silent_s:.0f} s while the trainers waited for the samples of step {step} "
                            "(generation.weight_sync_timeout_s); see its log"
                        ]
                    )
        self._check()
        # what the role generated before the trainer came for it, it generated while they trained
        self.count(
            trainer_wait_s=time.monotonic() - started,
            generate_s=batch.ended - batch.started,
            overlap_s=max(0.0, min(batch.ended, started) - batch.started),
        )
        return batch

    def _check(self) -> None:
        """Raises what ended the generator, or the role's exit."""
        if self.failure is not None:
            raise self.failure
        if role_lease.role_exited():
            raise SpecError([f"vllm role: the server at {self._base_url} exited while it generated; see its log"])

    def _healthy(self) -> bool:
        try:
            return self.session.get(f"{self._base_url}/health", timeout=role_lease.POLL_S).status_code == 200
        except requests.RequestException:
            return False

    @property
    def _base_url(self) -> str:
        return self.trainer.vllm_generation.vllm_client.base_url

    def push(self, version: int) -> None:
        """The weights of step ``version`` into the role, its requests frozen meanwhile: every rank takes part in TRL's
        weight sync (sharded weights gather), rank 0 pauses and resumes the role around it."""
        with self.deadline(version):
            started = time.monotonic()
            try:
                self._push_weights()
            except Exception as error:
                # the role's refusal or silence in one line; a bug, or a peer lost, stays what it is
                if not self.main or not _from_the_role(error):
                    raise
                doing = "exited" if role_lease.role_exited() else f"failed ({first_line(error)})"
                raise SpecError(
                    [
                        f"vllm role: the server at {self._base_url} {doing} while it took the weights of step "
                        f"{version}; see its log"
                    ]
                ) from None
            if not self.main:
                return
        self.count(weight_sync_s=time.monotonic() - started, weight_syncs=1)
        with self.changed:
            self.role_version = version
            self.changed.notify_all()

    def _push_weights(self) -> None:
        if self.main:
            # the requests running are frozen; nothing happens to them until /resume
            self._post("/pause", params={"mode": "keep"})
        self.trainer.vllm_generation.sync_weights()
        if not self.main:
            return
        # what they cached of the old weights is dropped: on /resume they go on from their tokens so far, recomputed
        # with the new weights
        if not self._post("/reset_prefix_cache", params={"reset_running_requests": "true"}).get("success", False):
            raise SpecError(
                [f"vllm role: the server at {self._base_url} kept its cache of the old weights; see its log"]
            )
        self._post("/resume")

    def summary(self) -> Dict[str, Any]:
        total = self.total
        return {
            **super().summary(),
            "weight_sync_steps": self.schedule.weight_sync_steps,
            "generate_s": round(total.generate_s, 3),
            "overlap_s": round(total.overlap_s, 3),
            "role_wait_s": round(total.role_wait_s, 3),
            "weight_sync_s": round(total.weight_sync_s, 3),
            "weight_syncs": total.weight_syncs,
            "regenerated_on_resume": self.regenerated,
        }

    def state(self) -> Dict[str, Any]:
        """Saved in each checkpoint's ``trainer_state.json``: the batches asked for ahead of it, which a run resumed
        from it generates again."""
        with self.changed:
            return {"args": {}, "attributes": {"asked_ahead": len(self.taken)}}

    # callbacks

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.first_step = state.global_step
        # the checkpoint resumed from (a lockstep run's has none, which the Trainer's next save expects)
        saved = state.stateful_callbacks.setdefault(type(self).__name__, self.state())
        if self.first_step > 0:
            self.regenerated = saved["attributes"].get("asked_ahead", 0)
            if self.main and self.regenerated:
                log.info(
                    "resumed at step %d: the %d batch(es) the vllm role had been asked for ahead of it are generated "
                    "again, from its weights",
                    self.first_step,
                    self.regenerated,
                )
        if self.main:
            client = self.trainer.vllm_generation.vllm_client
            # requests of its own, asked once (TRL's session retries): /health, and the push's pause and resume
            self.session = requests.Session()
            self.session.auth = client.session.auth
            self.generator = threading.Thread(target=self._generate_guarded, daemon=True)
            self.generator.start()
        # what the role holds until then is the model's files: a resumed run's weights differ, and the role is
        # TRL's, whose weights are pushed before it generates
        self.push(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % self.schedule.weight_sync_steps == 0 and state.global_step < state.max_steps:
            self.push(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.stop()

    def stop(self) -> None:
        """Ends the generator (a request in flight ends with the role, which the lease stops)."""
        with self.changed:
            self.stopping = True
            self.changed.notify_all()
        if self.generator is not None:
            self.generator.join(timeout=1.0)

    # rank 0's generator

    def _generate_guarded(self) -> None:
        try:
            self._generate()
        except SpecError as error:
            self.failure = error
        except Exception as error:  # noqa: BLE001 -- said by the trainer, in one line
            self.failure = SpecError(
                [
                    f"vllm role: the server at {self._base_url} failed while it generated ahead ({first_line(error)}); "
                    "see its log"
                ]
            )

    def _generate(self) -> None:
        client = self.trainer.vllm_generation.vllm_client
        while True:
            with self.changed:
                while not self.stopping and not self.batches:
                    self.changed.wait()
                if self.stopping:
                    return
                batch = self.batches.popleft()
                asked = time.monotonic()
                # never older than the bound, nor than the weights this run started from
                needed = max(batch.step - self.schedule.max_lag, self.first_step)
                while not self.stopping and self.role_version < needed:
                    self.changed.wait()
                if self.stopping:
                    return
                batch.version = self.role_version
            batch.started = time.monotonic()
            self.count(role_wait_s=batch.started - asked)
            batch.output = client.generate(prompts=batch.prompts, **self._sampling())
            batch.ended = time.monotonic()
            # as lockstep's generate counts, for run_summary.json
            count_generated(self.trainer.vllm_generation, batch.ended - batch.started, batch.output["completion_ids"])
            batch.done.set()

    def _sampling(self) -> Dict[str, Any]:
        """What TRL's ``VLLMGeneration.generate`` asks the server for, from the same settings."""
        generation = self.trainer.vllm_generation
        return {
            "n": self.trainer.num_generations,
            "repetition_penalty": generation.repetition_penalty,
            "temperature": generation.temperature,
            "top_p": generation.top_p,
            "top_k": generation.top_k,
            "min_p": 0.0 if generation.min_p is None else generation.min_p,
            "max_tokens": generation.max_completion_length,
            "logprobs": generation.logprobs,
            "structured_outputs_regex": generation.structured_outputs_regex,
            "generation_kwargs": generation.generation_kwargs,
        }

    def _post(self, path: str, **kwargs: Any) -> Dict[str, Any]:
        # no timeout of its own: the push's deadline bounds it
        answer = self.session.post(f"{self._base_url}{path}", **kwargs)
        if answer.status_code != 200:
            raise SpecError(
                [
                    f"vllm role: the server at {self._base_url} refused {path} (HTTP {answer.status_code}: "
                    f"{first_line(answer.text)}); see its log"
                ]
            )
        return answer.json()


def _from_the_role(error: Exception) -> bool:
    """Whether ``error`` is the role's answer, or its silence: what a request raised, or TRL's client's plain
    ``Exception("Request failed: <status>, <text>")``."""
    return isinstance(error, requests.RequestException) or type(error) is Exception


def install(trainer: Any, schedule: TrainingGeneration) -> Turns:
    """Makes ``trainer`` (TRL's ``GRPOTrainer`` or ``RLOOTrainer``, vLLM in server mode) generate as ``schedule``
    says: ahead of its training (``max_lag`` above 0, GRPO), else in lockstep, timed; its pushes bounded in time."""
    turns = RunAhead(trainer, schedule) if schedule.runs_ahead else Lockstep(trainer, schedule)
    generate_single_turn, log = trainer._generate_single_turn, trainer.log

    def single_turn(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.model.training:
            # evaluation, lockstep only (run_ahead_problems)
            return generate_single_turn(*args, **kwargs)
        if isinstance(turns, RunAhead):
            return turns.generate_single_turn(*args, **kwargs)
        return turns.generate_single_turn(generate_single_turn, *args, **kwargs)

    def logged(self: Any, logs: Dict[str, float], start_time: Optional[float] = None) -> None:
        log(turns.log(logs) if self.model.training else logs, start_time)

    if isinstance(turns, Lockstep):
        sync_weights = trainer.vllm_generation.sync_weights
        # an agent program's episodes (agent_rollouts.py) call the role instead of TRL's single turn
        rollout = getattr(trainer, "rollout_func", None)
        if rollout is not None:

            def timed_rollout(prompts: List[Any], trainer: Any) -> Dict[str, List[Any]]:
                if not trainer.model.training:
                    return rollout(prompts, trainer)
                return turns.generate_single_turn(rollout, prompts, trainer)

            trainer.rollout_func = timed_rollout

        def bounded_sync() -> None:
            with turns.deadline(trainer.state.global_step):
                sync_weights()

        trainer.vllm_generation.sync_weights = bounded_sync
    trainer._generate_single_turn = types.MethodType(single_turn, trainer)
    trainer.log = types.MethodType(logged, trainer)
    if isinstance(turns, RunAhead):
        trainer.get_batch_samples = turns.get_batch_samples
    trainer.add_callback(turns)
    setattr(trainer, _ATTRIBUTE, turns)
    return turns


def of(trainer: Any) -> Optional[Turns]:
    """The trainer's :class:`Turns`, if :func:`install` gave it some."""
    return getattr(trainer, _ATTRIBUTE, None)


_ATTRIBUTE = "posttrain_run_ahead"
