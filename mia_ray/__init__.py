"""mia-ray: audit what a language model was trained on, on Ray.

Importing this package must stay cheap: it never imports torch, ray or transformers.
"""

from mia_ray.errors import MiaError

__version__ = "0.1.0"
__all__ = ["MiaError", "__version__"]
