"""csdgen: fast autoregressive image generation by speculative Jacobi decoding with CSD.

>>> import csdgen
>>> result = csdgen.generate(model, [3, 7], method="csd", window=16, seed=0)  # doctest: +SKIP
>>> csdgen.pil_images(model, result)  # doctest: +SKIP

The public names are imported on first use (PEP 562 ``__getattr__``): ``import csdgen`` and
``csdgen --help`` do not pay for importing torch.
"""

from ._lazy import lazy_names

__version__ = "0.1.0"

_LAZY = {
    "generate": ".decoding",
    "GenerationResult": ".decoding",
    "ImageStats": ".decoding",
    "Decision": ".decoding",
    "METHODS": ".decoding",
    "SamplingConfig": ".sampling",
    "UnguidedSamplingWarning": ".sampling",
    "AcceptanceRule": ".acceptance",
    "SJD": ".acceptance",
    "CSD": ".acceptance",
    "Addition": ".acceptance",
    "JacobiMatch": ".acceptance",
    "make_rule": ".acceptance",
    "pil_images": ".runs",
    "save_run": ".runs",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
