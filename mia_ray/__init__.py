"""mia-ray: audit what a language model was trained on, on Ray.

    import mia_ray
    r = mia_ray.audit(model=..., suspected="my_files/", unseen="later_files/")

Every pipeline is a function here (``audit``, ``attack``, ``copycheck``, ``lumia``,
``memhunter``, ``leakage``, ``mark``, ``verify``, ``contamination``, ``demo``, and ``run`` for
any of them by name), returning a :class:`~mia_ray.api.Result`; see :mod:`mia_ray.api`.

Importing this package must stay cheap: it never imports torch, ray or transformers; the
API module loads on first use of one of its names.
"""

from mia_ray.errors import MiaError

__version__ = "0.1.0"
_API = ("Result", "attack", "audit", "contamination", "copycheck", "demo", "leakage", "lumia",
        "mark", "memhunter", "run", "verify")  # fmt: skip
__all__ = ["MiaError", "__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from mia_ray import api

        return getattr(api, name)
    raise AttributeError(f"module 'mia_ray' has no attribute {name!r}")
