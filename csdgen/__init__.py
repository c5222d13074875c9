"""csdgen: fast autoregressive image generation by speculative Jacobi decoding with CSD.

>>> import csdgen
>>> result = csdgen.generate(model, [3, 7], method="csd", window=16, seed=0)  # doctest: +SKIP
>>> csdgen.pil_images(model, result)  # doctest: +SKIP

The public names are imported on first use (PEP 562 ``__getattr__``): ``import csdgen`` and
``csdgen --help`` do not pay for importing torch.
"""

import logging

from ._lazy import lazy_names

__version__ = "0.1.0"

# transformers imports torchao (when installed, csdgen[quant]) with its model code; torchao then reports the
# CUDA-only kernel libraries it cannot load on a CPU machine and torch warns about its enum registrations:
# noise on every run's console, none of it about csdgen's use (int8 / fp8 weight-only need neither)
logging.getLogger("torchao").setLevel(logging.ERROR)
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)

_LAZY = {
    "generate": ".decoding",
    "GenerationResult": ".decoding",
    "ImageStats": ".decoding",
    "Decision": ".decoding",
    "METHODS": ".decoding",
    "ContinuousBatch": ".decoding",
    "FinishedImage": ".decoding",
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
