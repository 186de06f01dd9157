"""The one exception type that the CLI turns into a single clear line and exit code 2, and
the unwrapping of Ray's task and actor errors into the failure that caused them."""

from __future__ import annotations

import importlib
import re


class MiaError(Exception):
    """Bad input or an unusable setting: the message is what the user sees, alone on one line."""


# The last line of a Python traceback: "pkg.module.ErrorType: message".
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)): (.*\S)")


def _chain(exc: BaseException):
    """``exc`` and what it wraps: Ray's ``.cause``, ``__cause__`` and ``__context__``."""
    seen = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack.extend([e.__context__, e.__cause__, getattr(e, "cause", None)])


def _is_ray_wrapper(e: BaseException) -> bool:
    """Ray's envelopes around a failure: their own message is a remote traceback or nothing."""
    if not type(e).__module__.startswith("ray."):
        return False
    name = type(e).__name__
    return getattr(e, "cause", None) is not None or name.endswith(
        ("UserCodeException", "SystemException")
    )


def _remote_exception_line(e: BaseException) -> tuple[str, str] | None:
    """``(type name, message)`` from the last exception line of the remote traceback that an
    actor error carries as text only (an actor whose ``__init__`` raised keeps no cause)."""
    text = getattr(e, "error_msg", None)
    if not isinstance(text, str) or 'File "' not in text:  # no frames: no remote traceback
        return None
    found = None
    for line in text.splitlines():
        m = _EXC_LINE.match(line.strip())
        if m:
            found = (m.group(1), m.group(2))
    return found


def _names_mia_error(type_name: str) -> bool:
    module, _, name = type_name.rpartition(".")
    if not module.startswith("mia_ray"):
        return False
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False
    return isinstance(cls, type) and issubclass(cls, MiaError)


def _first_line(msg: str) -> str:
    msg = msg.strip()
    return msg.splitlines()[0] if msg else msg


def find_mia_error(exc: BaseException) -> MiaError | None:
    """Return the MiaError behind ``exc``, looking through Ray's task/actor error wrappers.

    Ray's wrapper class inherits from the user's exception type but its message is a whole
    remote traceback, so the original (``.cause``) is preferred; failing that, the first line.
    An actor that died in ``__init__`` keeps only the text of its traceback: its last line
    names a MiaError (``mia_ray.errors.MiaError: ...``) when bad input killed it.
    """
    for e in _chain(exc):
        cause = getattr(e, "cause", None)
        if isinstance(cause, MiaError):
            e = cause
        if isinstance(e, MiaError):
            # Ray Data appends its retry advice to the message of a map function's error.
            msg = str(e.args[0]) if e.args else str(e)
            return MiaError(_first_line(msg) or msg)
        remote = _remote_exception_line(e)
        if remote and _names_mia_error(remote[0]):
            return MiaError(remote[1])
    return None


def describe_failure(exc: BaseException) -> str:
    """One line naming what failed, for an unexpected error: ``Type: first line``.

    Ray wraps a failure inside a task or actor (``RayTaskError``, ``ActorDiedError``, Ray
    Data's ``UserCodeException``) in an exception whose message is a remote traceback; the
    line names the innermost cause instead, and says that it ran in Ray.
    """
    wrapped = False
    for e in _chain(exc):
        remote = _remote_exception_line(e)
        if remote:
            return _one_line(remote[0].rpartition(".")[2], remote[1], True)
        if _is_ray_wrapper(e):
            wrapped = True
            continue
        return _one_line(type(e).__name__, _first_line(str(e)), wrapped)
    return _one_line(type(exc).__name__, _first_line(str(exc)), wrapped)


def _one_line(name: str, msg: str, in_ray: bool) -> str:
    where = " (raised inside a Ray task or actor)" if in_ray else ""
    return f"{name}: {msg[:500]}{where}" if msg else f"{name}{where}"
