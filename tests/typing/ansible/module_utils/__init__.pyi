# ansible ships no types (no py.typed): everything but the module_utils beside this file is Any.
from typing import Any

def __getattr__(name: str) -> Any: ...
