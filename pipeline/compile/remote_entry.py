"""Whether a value read from the Redis remote cache is an entry Inductor wrote, judged before Inductor reads it.

Inductor decodes what its remote caches return without asking where it came from: a value that is not JSON, or
whose pickled program is not one of its compiled graphs, ends a compile in an assertion deep in torch (``Cache
candidate <class 'dict'> missing 'guards_expr'``) or a traceback in its log, neither naming the cache. Such a value is
damaged, or was written by another torch version or by someone else who can write the server. :func:`problem`
names what it is instead, so that :func:`pipeline.compile.cache.guarded_redis` can pass it over in one warning and
let the compile go on as a miss. Nothing here unpickles: the pickle's opcodes are read, never run.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import json
import pickletools
from typing import List, Optional

# Inductor's caches whose entries hold a pickled program, by the cache id in their keys (pt2:<id>::<key>:c<n>):
# the FX-graph and the AOTAutograd cache. Entries of the others (autotuning) are JSON only.
PICKLED = ("fx-graph", "autograd")
# What besides the strings of its module and name may come before the global that names the top object's class.
PREAMBLE = {"PROTO", "FRAME", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"}


def problem(key: str, value: bytes) -> Optional[str]:
    """What ``value``, stored under the Redis ``key`` of one of Inductor's remote caches, is where it is not an
    entry Inductor could use, or None."""
    try:
        entry = json.loads(value)
    except (UnicodeDecodeError, ValueError):
        return f"{len(value)} bytes that are not JSON"
    if not key.split("::")[0].removeprefix("pt2:").startswith(PICKLED):
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("data"), str):
        return f"JSON without the base64 'data' of a compiled program ({type(entry).__name__})"
    try:
        pickled = base64.b64decode(entry["data"], validate=True)
    except (binascii.Error, ValueError):
        return "a 'data' field that is not base64"
    return program_problem(pickled)


def program_problem(pickled: bytes) -> Optional[str]:
    """Why ``pickled`` is not one of Inductor's cached programs (an object of a torch class with guards), or None."""
    top: Optional[List[str]] = None  # the module and name of the first class the pickle names: its top object's
    strings: List[str] = []
    try:
        for opcode, arg, _ in pickletools.genops(pickled):  # every opcode, so that a stream cut short is seen
            if top is not None:
                continue
            if opcode.name == "GLOBAL":
                top = str(arg).split(" ", 1)
            elif opcode.name == "STACK_GLOBAL":
                top = strings[-2:]
            elif opcode.name.endswith("UNICODE"):
                strings.append(str(arg))
            elif opcode.name not in PREAMBLE:
                top = []  # the top object is no class instance (a dict, a list, a number)
    except ValueError as exc:
        return f"a damaged pickle ({exc})"
    if not top or len(top) != 2:
        return "pickled data whose top object is no class instance"
    module, name = top
    if module.split(".")[0] == "torch" and declares_guards(module, name):
        return None
    return f"a pickled {module}.{name}, not a compiled program"


def declares_guards(module: str, name: str) -> bool:
    """Whether torch's class ``module.name`` declares ``guards_expr``, the field Inductor asks of a cached program."""
    try:
        found = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return False
    return isinstance(found, type) and any("guards_expr" in vars(k).get("__annotations__", {}) for k in found.__mro__)
