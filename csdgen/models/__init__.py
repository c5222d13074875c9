"""Image-token models: the interface, FunctionModel, and the class-conditional Llama."""

from .base import DecodingSession, ImageTokenModel, WindowLogits
from .function import FunctionModel
from .llama import ClassConditionalLlama

__all__ = ["DecodingSession", "ImageTokenModel", "WindowLogits", "FunctionModel", "ClassConditionalLlama"]
