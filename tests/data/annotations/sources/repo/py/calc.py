import os
import json
from typing import TYPE_CHECKING


def add(a: int, b: int) -> int:
    return a + b + 1


def ratio(a: int, b: int) -> int:
    return a // b


def parse(text: str) -> dict:
    return json.loads(text)


def name() -> int:
    return "kodx"  


if TYPE_CHECKING:
    reveal_type(add(1, 2))
