"""A lamp the model can switch on (``environment: {factory: posttrain.templates.tools.lamp:Lamp}``).

Each rollout gets its own lamp, off; ``get_reward`` is 1 where the rollout
left it on, which only a call to ``switch_on`` does: a task no answer
solves without the tool.
"""

from typing import Any


class Lamp:
    """One rollout's lamp."""

    def reset(self, **row: Any) -> None:
        self.on = False

    def switch_on(self) -> str:
        """Switches the lamp on."""
        self.on = True
        return "The lamp is on."

    def get_reward(self) -> float:
        return float(self.on)
