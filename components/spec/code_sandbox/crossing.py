"""What crosses the pipes between the program and its tests: plain data as JSON lines, tagged where JSON has no
such type; any other object as a handle, numbered by the side that holds it."""

from typing import Any, Callable


def encode(value: Any, handle: Callable[[Any], Any]) -> Any:
    """``value`` as JSON, tagged where JSON has no such type; what is not plain data as ``handle`` says."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [encode(item, handle) for item in value]
    if kind in (tuple, set, frozenset):
        return {kind.__name__: [encode(item, handle) for item in value]}
    if kind is dict:
        return {"dict": [[encode(key, handle), encode(item, handle)] for key, item in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    return handle(value)


def decode(data: Any, handle: Callable[[int], Any]) -> Any:
    """What :func:`encode` made, back; a handle's number as ``handle`` says. Anything else is refused."""
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is list:
        return [decode(item, handle) for item in data]
    if kind is dict and len(data) == 1:
        [(tag, content)] = data.items()
        if tag in ("tuple", "set", "frozenset") and type(content) is list:
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](decode(item, handle) for item in content)
        if tag == "dict" and type(content) is list and all(type(pair) is list and len(pair) == 2 for pair in content):
            return {decode(key, handle): decode(item, handle) for key, item in content}
        if tag == "bytes" and type(content) is str:
            return bytes.fromhex(content)
        if tag == "complex" and type(content) is list and [type(part) for part in content] == [float, float]:
            return complex(*content)
        if tag == "handle" and type(content) is int:
            return handle(content)
    raise ValueError(f"not plain data: {str(data)[:80]}")
