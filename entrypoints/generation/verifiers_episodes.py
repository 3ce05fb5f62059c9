"""A verifiers environment's episodes (the spec's ``environment: {verifiers: <taskset id>}``) played as an agent
program's are (``agents.py``): each row's task, run by verifiers' harness, its model calls sent to the episode's
own path of the job's endpoint, scored by the taskset's rewards.

verifiers' eval client sends each turn as a chat request; the endpoint
renders it with the policy's template and records the ids it sampled, so a
turn that goes on with the conversation extends the one before, token for
token, and trains with the others as one sequence (``agent_rollouts.py``).
The request names no sampling settings: the endpoint's own (the trainer's,
or the evaluation's) apply.
"""

import os
from typing import Any, Awaitable, Callable, Dict, Tuple

from posttrain.components.spec.sections import VerifiersEnvironment
from posttrain.entrypoints.inputs.verifiers_tasks import KEY_COLUMN, imported, load_environment

# the variable verifiers reads the endpoint's key from: its subprocess runtime passes a harness every variable of
# the job but those whose name holds API_KEY
KEY_VARIABLE = "POSTTRAIN_ENDPOINT_API_KEY"
# the endpoint's hosts (endpoint.py serves on 127.0.0.1)
LOOPBACK = ("127.0.0.1", "localhost")


class EpisodeFailed(RuntimeError):
    """An episode verifiers ended without a score: the harness or a reward failed."""


def player(environment: VerifiersEnvironment) -> Tuple[Callable[..., Awaitable[Dict[str, Any]]], Callable[[], Any]]:
    """The environment's episode, a function of (client, model, row) as an agent program is, its taskset loaded
    once; and what its episodes need held while they play (verifiers' servers, ``env.serving``)."""
    vf = imported("environment.verifiers")
    env = load_environment(environment.taskset(), "environment.verifiers")
    tasks = {task.data.idx: task for task in env.taskset}
    # verifiers' client trusts the environment's proxies, which must not see the endpoint's key: loopback is direct
    bypassed = [host for host in os.environ.get("NO_PROXY", "").split(",") if host]
    os.environ["NO_PROXY"] = ",".join(bypassed + [host for host in LOOPBACK if host not in bypassed])

    async def episode(client: Any, model: str, row: Dict[str, Any]) -> Dict[str, Any]:
        os.environ[KEY_VARIABLE] = client.api_key
        endpoint = vf.EvalClientConfig(base_url=str(client.base_url), api_key_var=KEY_VARIABLE)
        played = await env.run_episode(tasks[row[KEY_COLUMN]], vf.ModelContext(model=model, client=endpoint))
        traces = played.traces
        if not played.ok or len(traces) != 1:
            errors = [*played.errors, *(error for trace in traces for error in trace.errors)]
            said = "; ".join(f"{error.type}: {error.message}" for error in errors)
            raise EpisodeFailed(said or f"the episode ended with {len(traces)} traces, not one")
        [trace] = traces
        # a reward that did not run is None
        metrics = {name: float(reward.score) for name, reward in trace.rewards.items() if reward is not None}
        return {"reward": float(trace.reward), "metrics": metrics}

    return episode, env.serving
