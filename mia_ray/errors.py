"""The one exception type that the CLI turns into a single clear line and exit code 2."""


class MiaError(Exception):
    """Bad input or an unusable setting: the message is what the user sees, alone on one line."""


def find_mia_error(exc: BaseException) -> MiaError | None:
    """Return the MiaError behind ``exc``, looking through Ray's task/actor error wrappers."""
    seen = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, MiaError):
            return e
        # RayTaskError wraps the user's exception as .cause; Ray Data re-raises with __cause__.
        stack.extend([getattr(e, "cause", None), e.__cause__, e.__context__])
    return None
