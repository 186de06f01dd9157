"""The one exception type that the CLI turns into a single clear line and exit code 2."""


class MiaError(Exception):
    """Bad input or an unusable setting: the message is what the user sees, alone on one line."""


def find_mia_error(exc: BaseException) -> MiaError | None:
    """Return the MiaError behind ``exc``, looking through Ray's task/actor error wrappers.

    Ray's wrapper class inherits from the user's exception type but its message is a whole
    remote traceback, so the original (``.cause``) is preferred; failing that, the first line.
    """
    seen = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        cause = getattr(e, "cause", None)
        if isinstance(cause, MiaError):
            return cause
        if isinstance(e, MiaError):
            msg = str(e.args[0]) if e.args else str(e)
            return MiaError(msg.strip().splitlines()[0] if msg.strip() else msg)
        stack.extend([cause, e.__cause__, e.__context__])
    return None
