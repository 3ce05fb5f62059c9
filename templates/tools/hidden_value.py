"""A room that hides a value (``environment: {factory: posttrain.templates.tools.hidden_value:Room}``).

Each rollout gets its own room holding its row's ``answer``, drawn at random
per row: a model can only know it by calling ``peek``.
"""

from typing import Any


class Room:
    """One rollout's room: the value its row hides."""

    def reset(self, **row: Any) -> None:
        self.value = str(row["answer"])

    def peek(self) -> str:
        """The value hidden in this room."""
        return self.value
