"""The decoding engine's public names, where they have always been importable.

The engine itself is the package :mod:`csdgen.engine` (the algorithm in its docstring, one idea
per file); this module only re-exports its public names, so ``from csdgen.decoding import
generate, GenerationResult, verify`` keeps working.
"""

from .engine.generation import generate
from .engine.methods import METHODS
from .engine.results import Decision, GenerationResult, ImageStats, StepInfo
from .engine.verification import Verdict, verify
from .engine.window import AUTO_MAX_WINDOW

__all__ = [
    "Decision",
    "ImageStats",
    "StepInfo",
    "GenerationResult",
    "Verdict",
    "verify",
    "generate",
    "METHODS",
    "AUTO_MAX_WINDOW",
]
