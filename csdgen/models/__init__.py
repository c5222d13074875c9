"""Image-token models: the interface, FunctionModel, the class-conditional Llama, and the family adapters.

The family adapters (``JanusImageModel``, ``Emu3ImageModel``, ``ChameleonImageModel``,
``GlmImageModel``, ``LiquidImageModel``), ``load_model`` and ``from_model`` (an already-loaded
transformers model) are imported on first use (PEP 562 ``__getattr__``): they pull in
transformers' model code, which ``import csdgen`` should not pay for.
"""

from .._lazy import lazy_names

from .base import DecodingSession, ImageTokenModel, WindowLogits
from .function import FunctionModel
from .llama import ClassConditionalLlama

_LAZY = {
    "JanusImageModel": ".janus",
    "Emu3ImageModel": ".emu3",
    "ChameleonImageModel": ".chameleon",
    "GlmImageModel": ".glm_image",
    "LiquidImageModel": ".liquid",
    "load_model": ".auto",
    "from_model": ".loaded",
    "family_of": ".detect",
    "check_memory": ".plan",
}

__all__ = ["DecodingSession", "ImageTokenModel", "WindowLogits", "FunctionModel", "ClassConditionalLlama", *_LAZY]


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
