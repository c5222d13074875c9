"""csdgen: fast autoregressive image generation by speculative Jacobi decoding with CSD.

>>> import csdgen
>>> result = csdgen.generate(model, [3, 7], method="csd", window=16, seed=0)  # doctest: +SKIP
"""

from .acceptance import CSD, SJD, AcceptanceRule, Addition, JacobiMatch, make_rule
from .decoding import METHODS, Decision, GenerationResult, ImageStats, generate
from .sampling import SamplingConfig

__version__ = "0.1.0"

__all__ = [
    "generate",
    "GenerationResult",
    "ImageStats",
    "Decision",
    "METHODS",
    "SamplingConfig",
    "AcceptanceRule",
    "SJD",
    "CSD",
    "Addition",
    "JacobiMatch",
    "make_rule",
]
