"""A safe the model opens in two calls (``environment: {factory: posttrain.templates.tools.safe:Safe}``).

Each rollout gets its own safe, locked; ``open_door`` works only once
``unlock`` has been called, and ``get_reward`` is 1 where the rollout left
the door open: a task that needs two tool calls, in order.
"""

from typing import Any


class Safe:
    """One rollout's safe."""

    def reset(self, **row: Any) -> None:
        self.unlocked = self.opened = False

    def unlock(self) -> str:
        """Unlocks the safe."""
        self.unlocked = True
        return "The safe is unlocked."

    def open_door(self) -> str:
        """Opens the safe's door, once it is unlocked."""
        if not self.unlocked:
            raise ValueError("the safe is locked: unlock it first")
        self.opened = True
        return "The door is open."

    def get_reward(self) -> float:
        return float(self.opened)
