"""The uniform streams of one iteration, by the engine's short names: the kinds are defined in
:mod:`csdgen.decisions` (below the engine, where :mod:`csdgen.trees` reads them too)."""

from ..decisions import ACCEPT_STREAM as _ACCEPT
from ..decisions import COUPLED_STREAM as _COUPLED
from ..decisions import INIT_STREAM as _INIT
from ..decisions import KEEP_STREAM as _KEEP
from ..decisions import RESIDUAL_STREAM as _RESIDUAL
from ..decisions import STREAM_KINDS as _KINDS
from ..decisions import Y_STREAM as _Y

__all__ = ["_KINDS", "_Y", "_ACCEPT", "_RESIDUAL", "_INIT", "_KEEP", "_COUPLED"]
