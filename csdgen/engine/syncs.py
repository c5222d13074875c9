"""Counting what would be host syncs on a GPU, on any device, the CPU included (:class:`HostSyncCounter`).

On a GPU the host queues work and runs ahead; every operation that makes it wait for the device
(a *host sync*) leaves the device idle while the host prepares the next kernels. The decoding loop
is written to make one per iteration: the read of the verify results (committed lengths, the
non-finite flag, ``window="auto"``'s counts) it needs to decide the next window. CUDA reports
syncs itself (``torch.cuda.set_sync_debug_mode("warn")``); this counter finds them on a CPU, where
host and device are the same memory, by following which tensors *would* live on the device:

* **device tensors**: the tensors of the objects given to the counter (a model's parameters and
  buffers), tensors made by a factory given a ``device`` (``torch.zeros(..., device=d)``), copies
  made by ``.to(device)``, and the output of every operation with a device tensor among its inputs;
* **host tensors**: tensors made by a factory without a ``device`` (or with the string ``"cpu"``),
  by ``.cpu()``, and the output of operations on host tensors only. Tensors made before the counter
  started that it was not given, and those made inside PyTorch's composite operations, are
  neither: they take the side of the tensors they meet.

On a CPU run ``torch.device("cpu")`` names the run's device, so a ``.to(d)`` or ``device=d`` with a
``torch.device`` object means the device and the host is written ``.cpu()`` or ``"cpu"`` (the
convention of csdgen's engines). It records as **host syncs**:

* ``read``: ``.item()``, ``bool(t)``, ``int(t)``, ``float(t)``, ``.tolist()``, ``torch.equal`` on a
  device tensor (``aten._local_scalar_dense`` and friends);
* ``shape``: operations whose output shape depends on a device tensor's values: ``nonzero``,
  boolean-mask indexing and assignment, ``masked_select``, ``unique``, ``bincount``,
  ``repeat_interleave`` with a tensor of repeats and no ``output_size``;
* ``d2h``: a copy of a device tensor to the host (``.cpu()``, ``.to("cpu")``, ``.numpy()``, a write
  into a host tensor);
* ``h2d``: a blocking host -> device copy: ``.to(device)`` of a host tensor without
  ``non_blocking=True``, ``torch.tensor(..., device=d)``, ``torch.as_tensor(host, device=d)``, and a
  host tensor (not a 0-dim one: those are passed to kernels by value) as an input of a device
  operation (an index, a value written).

A ``.to(device, non_blocking=True)`` of a host tensor (:func:`csdgen.transfer.to_device`, which pins
it first on CUDA) and the static session's own transfer helper are recorded as *queued copies*,
not syncs.

Events are grouped by phase: ``"setup"`` (opening the session, prefill), the decoding iterations
``1, 2, ...`` (one :meth:`_Loop._advance` each, with the row selection that follows it when images
finish) and ``"end"`` (the result's statistics). Usage::

    from csdgen.engine.syncs import HostSyncCounter

    with HostSyncCounter(model) as counter:
        result = csdgen.generate(model, ...)
    print(counter.summary())               # per phase, and where each sync happened
    assert counter.per_iteration() == [1] * len(result.widths)

Not thread-safe (the patches are process-wide while the counter is active), and not for compiled
steps (``torch.compile`` traces under its own modes: run the static engine with ``compile=False``
under it). Every operation goes through Python while it is active: a run is slower. On CUDA it
counts the same way (``torch.device("cpu")`` is then the host); ``torch.cuda.set_sync_debug_mode``
reports the syncs themselves.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["HostSyncCounter", "SyncEvent", "SYNC_KINDS"]

#: the kinds of host sync the counter records (see the module docstring)
SYNC_KINDS = ("read", "shape", "d2h", "h2d")

_HOST, _DEVICE = "host", "device"

#: operations whose output shape depends on their input's values (the host reads a count)
_DATA_DEPENDENT = {"nonzero", "nonzero_numpy", "argwhere", "masked_select", "_unique", "_unique2", "unique_dim",
                   "unique_consecutive", "unique_dim_consecutive", "bincount", "histc"}
#: operations returning a Python value read from their inputs
_READS = {"_local_scalar_dense", "equal", "is_nonzero", "allclose"}
#: Python-level factories: ``device=`` decides where their output lives
_FACTORIES = ("zeros", "ones", "full", "empty", "arange", "eye", "rand", "randn", "randint", "linspace", "logspace",
              "randperm", "empty_strided")
_HERE = os.path.abspath(__file__)
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


@dataclass
class SyncEvent:
    """One host sync the counter saw.

    Attributes:
        kind: one of :data:`SYNC_KINDS`.
        what: the operation or method (``"aten.nonzero"``, ``".cpu()"``, ``"torch.tensor"``).
        phase: ``"setup"``, an iteration number (1-based, counted over the counter's life) or ``"end"``.
        where: the innermost frames outside PyTorch, innermost first (``file:line function``).
    """

    kind: str
    what: str
    phase: Any
    where: str


def _where() -> str:
    frames = [f for f in traceback.extract_stack()[:-3]
              if not f.filename.startswith(_TORCH_DIR) and os.path.abspath(f.filename) != _HERE]
    return " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(frames[-3:]))


class HostSyncCounter(TorchDispatchMode):
    """Records what would be host syncs on a GPU while active (see the module docstring).

    Args:
        *roots: objects whose tensors live on the device: ``nn.Module``\\ s (parameters and buffers),
            tensors, or any object whose attributes hold modules or tensors (an
            :class:`~csdgen.models.base.ImageTokenModel`: its transformer, codebook, ...).
        device: the run's device (default: the device of the first tensor found in ``roots``, else the CPU).

    Attributes:
        events: every :class:`SyncEvent`, in order.
        queued: ``[(phase, what, where)]`` host -> device copies queued without a sync.
        iterations: decoding iterations seen (:meth:`_Loop._advance` calls).
    """

    def __init__(self, *roots: Any, device: Any = None):
        super().__init__()
        self._taint = WeakIdKeyDictionary()
        found = []
        for root in roots:
            found.extend(_tensors_of(root))
        for t in found:
            self._taint[t] = _DEVICE
        self.device = torch.device(device) if device is not None else (found[0].device if found else torch.device("cpu"))
        self.events: list[SyncEvent] = []
        self.queued: list[tuple[Any, str, str]] = []
        self.iterations = 0
        self.phase: Any = "setup"
        self._quiet = 0
        self._undo: list[Callable[[], None]] = []

    # -- results ------------------------------------------------------------------------------------

    def syncs(self, phase: Any = None) -> list[SyncEvent]:
        """The events of ``phase`` (None: all)."""
        return [e for e in self.events if phase is None or e.phase == phase]

    def per_iteration(self) -> list[int]:
        """Host syncs in each decoding iteration, iterations ``1 .. iterations`` in order."""
        counts = [0] * self.iterations
        for e in self.events:
            if isinstance(e.phase, int):
                counts[e.phase - 1] += 1
        return counts

    def queued_per_iteration(self) -> list[int]:
        """Queued (non-blocking) host -> device copies in each decoding iteration."""
        counts = [0] * self.iterations
        for phase, _, _ in self.queued:
            if isinstance(phase, int):
                counts[phase - 1] += 1
        return counts

    def summary(self, limit: int = 20) -> str:
        """Syncs per phase, then the distinct syncs (kind, operation, where) with their counts, most frequent first."""
        per = self.per_iteration()
        lines = [f"setup: {len(self.syncs('setup'))} syncs; iterations: {self.iterations}, syncs per iteration "
                 f"min {min(per, default=0)} max {max(per, default=0)} total {sum(per)}; end: {len(self.syncs('end'))}; "
                 f"queued copies per iteration: max {max(self.queued_per_iteration(), default=0)}"]
        seen: dict[tuple, list] = {}
        for e in self.events:
            key = ("iteration" if isinstance(e.phase, int) else e.phase, e.kind, e.what, e.where)
            seen.setdefault(key, []).append(e)
        for (phase, kind, what, where), group in sorted(seen.items(), key=lambda kv: -len(kv[1]))[:limit]:
            lines.append(f"  {len(group):5d} x {phase:9s} {kind:5s} {what:28s} {where}")
        return "\n".join(lines)

    # -- taint --------------------------------------------------------------------------------------

    def _side(self, t: torch.Tensor) -> str | None:
        return self._taint.get(t)

    def _mark(self, value: Any, side: str | None) -> None:
        if side is None:
            return
        for t in tree_leaves(value):
            if isinstance(t, torch.Tensor):
                self._taint[t] = side

    def _record(self, kind: str, what: str) -> None:
        self.events.append(SyncEvent(kind, what, self.phase, _where()))

    def _target(self, spec: Any) -> str | None:
        """Where a ``device`` argument points: the device, the host, or None (not a device)."""
        if isinstance(spec, torch.Tensor):
            return self._side(spec) or _HOST
        if isinstance(spec, str):
            return _HOST if spec == "cpu" else _DEVICE
        if isinstance(spec, torch.device):
            return _DEVICE if spec == self.device or spec.type != "cpu" else _HOST
        if isinstance(spec, int) and not isinstance(spec, bool):
            return _DEVICE
        return None

    # -- the dispatch mode ----------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self._quiet:
            return out
        leaves = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        sides = [self._side(t) for t in leaves]
        on_device = _DEVICE in sides
        name = func.overloadpacket.__name__
        written = _written(func, args, kwargs)
        if on_device:
            if name in _READS:
                self._record("read", f"aten.{name}")
            elif name in _DATA_DEPENDENT or (name == "repeat_interleave" and _tensor_repeats(func, args, kwargs)):
                self._record("shape", f"aten.{name}")
            elif name == "index" and _bool_index(args, self):
                self._record("shape", "boolean-mask indexing")
            elif name in ("index_put", "index_put_", "_index_put_impl_") and _bool_index(args, self) \
                    and not _masked_fill_path(args, self):
                self._record("shape", "boolean-mask assignment")
            for t, side in zip(leaves, sides):
                if side == _HOST and t.dim() > 0:
                    if any(t is w for w in written):
                        self._record("d2h", f"aten.{name} into a host tensor")
                    else:
                        self._record("h2d", f"host tensor into aten.{name}")
            host_written = [w for w in written if self._side(w) == _HOST]
            self._mark([o for o in tree_leaves(out) if isinstance(o, torch.Tensor)
                        and not any(o is w for w in host_written)], _DEVICE)
        elif _HOST in sides:
            self._mark(out, _HOST)
        return out

    # -- patches --------------------------------------------------------------------------------------

    def __enter__(self):
        self._patch_tensor_methods()
        self._patch_factories()
        self._patch_engine()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            while self._undo:
                self._undo.pop()()

    def _replace(self, owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        had = name in vars(owner)
        original = getattr(owner, name)
        setattr(owner, name, make(original))

        def undo():
            if had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)

        self._undo.append(undo)

    def _quietly(self, fn, *args, **kwargs):
        self._quiet += 1
        try:
            return fn(*args, **kwargs)
        finally:
            self._quiet -= 1

    def _patch_tensor_methods(self) -> None:
        counter = self

        def make_to(original):
            def to(t, *args, **kwargs):
                if counter._quiet:
                    return original(t, *args, **kwargs)
                spec = kwargs.get("device", next((a for a in args if counter._target(a) is not None
                                                  and not isinstance(a, (bool, torch.dtype))), None))
                target = counter._target(spec) if spec is not None else None
                source = counter._side(t)
                if target is None or target == source or (target == _HOST and source is None):
                    return original(t, *args, **kwargs)
                blocking = not kwargs.get("non_blocking", next((a for a in args if isinstance(a, bool)), False))
                out = counter._quietly(original, t, *args, **kwargs)
                if out is t:
                    out = counter._quietly(t.clone)
                if target == _DEVICE:
                    if blocking:
                        counter._record("h2d", ".to(device)")
                    else:
                        counter.queued.append((counter.phase, ".to(device, non_blocking=True)", _where()))
                else:
                    counter._record("d2h", ".to(host)")
                counter._mark(out, target)
                return out
            return to

        def make_cpu(original):
            def cpu(t, *args, **kwargs):
                if counter._quiet:
                    return original(t, *args, **kwargs)
                if counter._side(t) == _DEVICE:
                    counter._record("d2h", ".cpu()")
                    out = counter._quietly(original, t, *args, **kwargs)
                    out = counter._quietly(t.clone) if out is t else out
                else:
                    out = original(t, *args, **kwargs)
                counter._mark(out, _HOST)
                return out
            return cpu

        def make_read(label, kind):
            def wrap(original):
                def read(t, *args, **kwargs):
                    if not counter._quiet and counter._side(t) == _DEVICE:
                        counter._record(kind, label)
                    return counter._quietly(original, t, *args, **kwargs)
                return read
            return wrap

        self._replace(torch.Tensor, "to", make_to)
        self._replace(torch.Tensor, "cpu", make_cpu)
        self._replace(torch.Tensor, "tolist", make_read(".tolist()", "read"))
        self._replace(torch.Tensor, "numpy", make_read(".numpy()", "d2h"))

    def _patch_factories(self) -> None:
        counter = self

        def make_factory(original):
            def factory(*args, **kwargs):
                if counter._quiet:
                    return original(*args, **kwargs)
                out = counter._quietly(original, *args, **kwargs)
                spec = kwargs.get("device")
                counter._mark(out, counter._target(spec) if spec is not None else _HOST)
                return out
            return factory

        def make_tensor(original, positional_device: bool):
            def tensor(data, *args, **kwargs):
                if counter._quiet:
                    return original(data, *args, **kwargs)
                spec = kwargs.get("device", args[1] if positional_device and len(args) > 1 else None)
                target = counter._target(spec) if spec is not None else None
                source = _data_side(counter, data)
                out = counter._quietly(original, data, *args, **kwargs)
                where = target or (source if isinstance(data, torch.Tensor) else _HOST)
                if where == _DEVICE and source != _DEVICE:
                    counter._record("h2d", f"torch.{original.__name__}(host data, device=...)")
                elif where == _HOST and source == _DEVICE:
                    counter._record("d2h", f"torch.{original.__name__}(device data) on the host")
                counter._mark(out, where)
                return out
            return tensor

        def make_one_hot(original):
            def one_hot(t, *args, **kwargs):  # its CPU kernel reads min / max; CUDA's does not (num_classes given)
                out = counter._quietly(original, t, *args, **kwargs)
                counter._mark(out, counter._side(t))
                return out
            return one_hot

        for name in _FACTORIES:
            if hasattr(torch, name):
                self._replace(torch, name, make_factory)
        self._replace(torch, "tensor", lambda original: make_tensor(original, False))
        self._replace(torch, "as_tensor", lambda original: make_tensor(original, True))
        self._replace(torch.nn.functional, "one_hot", make_one_hot)

    def _patch_engine(self) -> None:
        from .loop import _Loop

        counter = self

        def make_advance(original):
            def advance(loop, *args, **kwargs):
                counter.iterations += 1
                counter.phase = counter.iterations
                return original(loop, *args, **kwargs)
            return advance

        def make_phase(phase):
            def wrap(original):
                def method(loop, *args, **kwargs):
                    counter.phase = phase
                    return original(loop, *args, **kwargs)
                return method
            return wrap

        classes = [_Loop]
        while classes:
            cls = classes.pop()
            classes.extend(cls.__subclasses__())
            if "_advance" in vars(cls):
                self._replace(cls, "_advance", make_advance)
            if "_image_stats" in vars(cls):
                self._replace(cls, "_image_stats", make_phase("end"))
            if "run" in vars(cls):
                self._replace(cls, "run", make_phase("setup"))


def _tensors_of(root: Any) -> list[torch.Tensor]:
    """The tensors ``root`` holds: itself, a module's parameters and buffers, or its attributes' (one level)."""
    if isinstance(root, torch.Tensor):
        return [root]
    if isinstance(root, torch.nn.Module):
        return list(root.parameters()) + list(root.buffers())
    found = []
    for value in vars(root).values() if hasattr(root, "__dict__") else ():
        if isinstance(value, (torch.Tensor, torch.nn.Module)):
            found.extend(_tensors_of(value))
    return found


def _data_side(counter: HostSyncCounter, data: Any) -> str | None:
    sides = {counter._side(t) for t in tree_leaves(data) if isinstance(t, torch.Tensor)}
    return _DEVICE if _DEVICE in sides else _HOST if isinstance(data, torch.Tensor) or sides else None


def _written(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors ``func`` writes into (in-place ``self``, ``out=``)."""
    written = []
    for i, arg in enumerate(func._schema.arguments):
        info = arg.alias_info
        if info is not None and info.is_write:
            value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
            written.extend(t for t in tree_leaves(value) if isinstance(t, torch.Tensor))
    return written


def _tensor_repeats(func, args, kwargs) -> bool:
    """``repeat_interleave`` with a tensor of repeats and no ``output_size``: its output size is read back."""
    repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if args else None)
    if func.overloadpacket.__name__ == "repeat_interleave" and len(args) == 1:
        repeats = args[0]
    output_size = kwargs.get("output_size", args[3] if len(args) > 3 else None)
    return isinstance(repeats, torch.Tensor) and repeats.dim() > 0 and output_size is None


def _bool_index(args, counter: HostSyncCounter) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) and counter._side(i) == _DEVICE
               for i in indices)


def _masked_fill_path(args, counter: HostSyncCounter) -> bool:
    """``t[mask] = value`` with one boolean index and a one-element host value runs as ``masked_fill_``: no sync."""
    indices, value = args[1], args[2] if len(args) > 2 else None
    return (len([i for i in indices if i is not None]) == 1 and isinstance(value, torch.Tensor)
            and value.numel() == 1 and counter._side(value) != _DEVICE)
