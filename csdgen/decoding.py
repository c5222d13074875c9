"""The decoding engine's public names, where they have always been importable.

The engine itself is the package :mod:`csdgen.engine` (the algorithm in its docstring, one idea
per file); this module only re-exports its public names, so ``from csdgen.decoding import
generate, GenerationResult, verify`` keeps working.
"""

from .engine import (AUTO_MAX_WINDOW, METHODS, ContinuousBatch, Decision, FinishedImage, GenerationResult, ImageStats,
                     StepInfo, Verdict, check_conditions, check_engine, check_top_k, default_sampling, generate,
                     resolve_arguments, resolve_method, verify)

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
    "ContinuousBatch",
    "FinishedImage",
    "resolve_arguments",
    "check_conditions",
    "check_engine",
    "check_top_k",
    "resolve_method",
    "default_sampling",
]
