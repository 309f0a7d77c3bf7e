"""lowbit: fast, verified CPU inference of low-bit GGUF models.

The native kernels live in the private extension ``lowbit._lowbit``; this package is the
public face: ``lowbit.formats()``, ``lowbit.gguf.open()``, ``lowbit.kernels``.
"""
# Note: the package attribute `formats` is the function (lowbit.formats() is the public
# API); modules import names from .formats with `from .formats import ...`.
from . import gguf, kernels
from .formats import Format, formats
from .gguf import GGUFError
from .model import Model, ModelConfig, load

__all__ = ["Format", "GGUFError", "Model", "ModelConfig", "formats", "gguf", "kernels", "load", "__version__"]
__version__ = "0.1.0"
