"""Continuous batching (:class:`ContinuousBatch`): a running batch that images join and leave
between iterations, the engine a server's scheduler drives one iteration at a time.

:func:`csdgen.generate` opens a batch, runs it until its last image is complete and returns.
A server cannot wait like that: requests arrive while a batch runs, and under speculative
decoding the images of a batch finish at different forwards (their step compressions differ).
:class:`ContinuousBatch` is the same loop (:class:`csdgen.engine.loop._Loop`: draft, forward,
verify, commit, roll back) cut at its iteration boundary:

* :meth:`ContinuousBatch.admit` opens a session for the new images (``model.start``), runs
  their prefill (token 0 of each image) and joins its rows to the running session
  (:meth:`csdgen.models.base.DecodingSession.admit`): every row keeps its own positions and
  cache length, so an admitted image sits beside images halfway through theirs. Into a running
  static session, images whose prompts are one token (a class-conditional model such as the
  built-in one) join unprefilled
  (:meth:`csdgen.models._static_rows.StaticRows.admit_unprefilled`) and take their prefill in the
  first slot of the next iteration's window, where it costs one more column of a forward the batch
  runs anyway instead of a forward of its own; token 0 is drawn as the prefill draws it (the same
  target, the same uniform), so the image's tokens are the same either way;
* :meth:`ContinuousBatch.step` runs one iteration for every image in the batch and returns the
  images it completed, whose rows leave the batch;
* :meth:`ContinuousBatch.cancel` removes images (a client went away) at once.

**Same images as offline.** An image draws every random number from its own stream keyed by
``(seed, image index, its own forward count)`` (:func:`csdgen.sampling.stream_uniforms`; here
each image brings its own seed), its window starts at its own committed length and carried
drafts are its own, so with a fixed window an image admitted with seed ``s`` and index ``i``
gets the tokens of ``csdgen.generate(model, [condition], seed=s, image_indices=[i], ...)``
whatever else is in the batch, and whenever it joined (up to the floating-point summation order
of batched kernels; exact on a float64 model, tested). With ``window="auto"`` the width of each
iteration is chosen for the whole batch from measured times, so images keep their
distribution (the rules are exact for any width), not their tokens. The choice is priced for the
batch it runs: the tokens its rows are expected to commit, each capped by its own image end, per
second of an iteration of the batch slots it fills (:mod:`csdgen.engine.window`, a served batch):
where a full batch is compute-bound (a CPU) that is width 1, as AR, and wider as the batch thins.

Every image of one batch shares the method, window, drafting and sampling settings (one
forward, one rule); a server keeps one batch per setting and runs the one whose turn it is
(:mod:`csdgen.serve.scheduler`). Draft trees are not offered here (``generate(..., tree=...)``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from ..acceptance import AcceptanceRule
from ..integers import integers_per_image
from ..models.base import ImageTokenModel
from ..sampling import SamplingConfig
from .generation import check_conditions, check_engine, resolve_arguments
from ..sampling import MAX_SEED, as_integer, check_seed
from .loop import _Loop, _signed64
from .results import ImageStats

__all__ = ["ContinuousBatch", "FinishedImage"]


@dataclass
class FinishedImage:
    """An image :meth:`ContinuousBatch.step` completed.

    Attributes:
        handle: the handle :meth:`ContinuousBatch.admit` returned for it.
        tokens: ``[N]`` int64 CPU image tokens (raster order).
        stats: its :class:`~csdgen.engine.results.ImageStats` (forwards, tokens per forward, decisions).
    """

    handle: int
    tokens: torch.Tensor
    stats: ImageStats


class ContinuousBatch:
    """A batch of images decoding together, which images join and leave between iterations.

    Args:
        model: any :class:`~csdgen.models.base.ImageTokenModel`. Images join a running batch where
            its sessions can :meth:`~csdgen.models.base.DecodingSession.admit` (every transformers
            family and ``FunctionModel``); a session that cannot works one batch at a time
            (:attr:`admits_while_running` is then False).
        method, window, sampling, draft_init, refresh: as :func:`csdgen.generate` (defaults from
            ``model.defaults``); shared by every image of the batch.
        engine, compile: as :func:`csdgen.generate`: ``"auto"`` runs the static session
            (:mod:`csdgen.models._static`: a preallocated per-row cache of ``capacity`` batch
            slots, images joining into free slots) wherever ``generate`` would, ``"eager"`` the
            ragged one (a cache whose width follows the longest row).
        capacity: batch slots a static session is opened with (a server's ``--max-batch``: the
            most images it admits); default: the first admission's image count (compiled: rounded
            up to a power of two). More images than that may join: the cache then grows (a copy
            into one with more slots). A compiled static session decodes in the model's buffers
            and compiled steps (:mod:`csdgen.models._static`) and gives them back when the batch
            drains to empty, for the next batch.

    Attributes:
        settings: the resolved settings (as :attr:`csdgen.GenerationResult.settings`, without seed,
            engine and compile: the batch's session decides those when it opens).
        forwards: model calls so far (iterations and the admission prefills that ran a forward of their own).
        rows_fed: sum over iterations of the images in the batch (mean occupancy: ``rows_fed / iterations``).
        iterations: iterations (:meth:`step` calls that ran a forward).

    Raises:
        ValueError: as :func:`csdgen.generate` for a bad method, window, sampling or drafting.
    """

    def __init__(self, model: ImageTokenModel, *, method: str | AcceptanceRule = "csd", window: int | str | None = None,
                 sampling: SamplingConfig | Mapping[str, Any] | None = None, draft_init: str | None = None, refresh: str | None = None,
                 engine: str = "auto", compile: bool | None = None, capacity: int | None = None):
        check_engine(engine, compile)  # compile="yes" compiled (truthy), as generate refuses it
        if capacity is not None and (as_integer(capacity) is None or capacity < 1):
            raise ValueError(f"capacity={capacity!r}: allowed an integer >= 1 (batch slots)")
        capacity = None if capacity is None else as_integer(capacity)  # numpy's integers too
        self.engine, self.compile, self.capacity = engine, compile, capacity
        rule, window, draft_init, sampling, settings = resolve_arguments(model, method, window, sampling, draft_init,
                                                                         refresh)
        refresh = settings["refresh"]
        settings.pop("seed")
        self.model, self.settings = model, settings
        self.N = model.num_image_tokens
        loop = self._loop = _Loop(model, rule, window, 0, sampling, draft_init, refresh, None, False)
        loop._allocate(0)
        loop.session = None
        loop.active = torch.zeros(0, dtype=torch.long, device=loop.device)
        loop.active_host = torch.zeros(0, dtype=torch.long)
        loop.committed_host = torch.zeros(0, dtype=torch.long)
        loop.widths = []
        loop.steps = 0
        loop.paced_by_laggard = False  # images join at different steps; no batch ends with its slowest
        loop.batch_priced = True  # window="auto" priced for the batch it runs (_AutoWindow.choose's remaining)
        loop._probe = self.N >= 3 and loop.PROBE
        loop._checked = False
        self._handles: list[int] = []  # the handle of each buffer row
        self._next = 0
        self.forwards = self.iterations = self.rows_fed = 0
        self.admits_while_running = True

    # -- what the scheduler reads -------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Images in the batch now."""
        return len(self._loop.active_host)

    @property
    def handles(self) -> list[int]:
        """Handles of the images in the batch, in row order."""
        return [self._handles[s] for s in self._loop.active_host.tolist()]

    #: iterations whose widths :attr:`widths` keeps
    KEEP_WIDTHS = 10_000

    @property
    def widths(self) -> list[int]:
        """The window width of every iteration so far (the last :attr:`KEEP_WIDTHS` and more)."""
        return list(self._loop.widths)

    def progress(self, handles: Sequence[int]) -> tuple[list[int], torch.Tensor]:
        """Committed lengths ``[k]`` and tokens ``[k, N]`` int64 CPU (committed, then pending drafts)
        of images in the batch (for partial images).

        Raises:
            KeyError: a handle not in the batch (finished, cancelled or never admitted), naming it.
        """
        slot_of = {h: s for s, h in enumerate(self._handles)}
        handles = [as_integer(h) if as_integer(h) is not None else h for h in handles]  # numpy's and 0-d tensors as ints
        missing = next((h for h in handles if h not in slot_of), None)
        if missing is not None:
            raise KeyError(f"handle {missing!r} is not in the batch (finished, cancelled or never admitted); in it: "
                           f"{sorted(slot_of)[:8]}")
        slots = [slot_of[h] for h in handles]
        loop = self._loop
        committed = [int(loop.committed_host[s]) for s in slots]
        pick = torch.tensor(slots, dtype=torch.long, device=loop.device)
        return committed, loop.tokens[pick, : self.N].cpu()

    # -- joining and leaving -------------------------------------------------------------------------

    def admit(self, conditions: Sequence[Any], seeds: Sequence[int], image_indices: Sequence[int]) -> list[int]:
        """Open the new images' session, run their prefill and join their rows to the batch (into a
        running static batch, images whose prompts are one token join unprefilled: their prefill is
        the first slot of the next :meth:`step`'s window, see the module docstring).

        Args:
            conditions: one condition per new image (what ``model.start`` takes).
            seeds: one seed per image (an integer 0 .. 2**63 - 1, as ``generate``'s ``seed``).
                Unlike ``generate``, a seed and image index may repeat (two requests of a server
                may ask for the same image; each image then gets the same tokens).
            image_indices: one index in 0 .. 2**63 - 1 per image (``generate``'s ``image_indices``).

        Returns:
            one handle (int) per image, in order.

        Raises:
            ValueError: conditions the model rejects or not in a list, bad seeds or indices, non-finite logits at
                the prefill (the batch is unchanged; a prefill taken in the next iteration's window
                raises from :meth:`step` instead), or a running batch whose session cannot
                admit rows (:attr:`admits_while_running` False).
        """
        check_conditions(conditions)  # a bare name was read letter by letter, a bare index was a TypeError
        conditions = list(conditions)
        k = len(conditions)
        if k == 0:
            return []
        seeds = [_signed64(check_seed(s, f"seeds[{i}]")) for i, s in enumerate(integers_per_image("seeds", seeds, k))]
        indices = integers_per_image("image_indices", image_indices, k, 0, MAX_SEED)
        loop = self._loop
        if self.size and not self.admits_while_running:
            raise ValueError(f"{type(loop.session).__name__} cannot admit rows into a running batch")
        new = self._open(self.model.start(conditions, k, loop.sampling.guided), k)
        if new.batch_size != k:
            raise ValueError(f"the model opened {new.batch_size} rows for {k} conditions")
        if self.size and not getattr(new, "supports_admission", False):
            self.admits_while_running = False
            raise ValueError(f"{type(new).__name__} cannot admit rows into a running batch")
        B0 = loop.B
        self._grow(k)
        dev = loop.device
        slots = torch.arange(B0, B0 + k, device=dev)
        loop.indices[slots] = torch.tensor(indices, dtype=torch.long, device=dev)
        loop.seeds[slots] = torch.tensor(seeds, dtype=torch.long, device=dev)
        fold = bool(self.size and self.N > 1 and getattr(loop.session, "can_admit_unprefilled", None)
                    and loop.session.can_admit_unprefilled(new))
        try:
            if fold:  # their prefill is the first slot of the next iteration's window (loop._iterate)
                loop.session.admit_unprefilled(new)
                loop.committed[slots] = 0
            else:
                bad = loop._prefill(new, slots)
                if bool(bad):  # the model's logits, or the sampling settings overflowing float32 (as generate says)
                    raise ValueError(f"at the prefill of these images: {loop._non_finite_message()}")
            if self.size == 0:
                loop.session = new
                self.admits_while_running = bool(getattr(new, "supports_admission", False))
                if loop.auto is not None:  # a static session prices widths per bucket
                    loop.auto.buckets = getattr(new, "width_buckets", None)
                loop._probe = loop._probe and getattr(new, "rollback_probe", True)
            elif not fold:
                loop.session.admit(new)
        except BaseException:
            self._truncate(B0)
            raise
        self.forwards += 0 if fold else 1
        loop.active = torch.cat([loop.active, slots])
        loop.active_host = torch.cat([loop.active_host, slots.cpu()])
        loop.committed_host = torch.cat([loop.committed_host, torch.full((k,), 0 if fold else 1, dtype=torch.long)])
        handles = list(range(self._next, self._next + k))
        self._next += k
        self._handles += handles
        return handles

    def _open(self, session, k: int):
        """The session the new images decode in: the ragged ``session`` itself, or its static
        counterpart (``engine``): with ``capacity`` batch slots when it opens the batch, with ``k``
        when it joins a running static session (its rows are then copied in, StaticSession.admit)."""
        from ..models._static import StaticSession, make_static, open_engine

        running = self._loop.session if self.size else None
        if running is None:
            return open_engine(session, self.engine, self.compile, capacity=self.capacity)
        if isinstance(running, StaticSession):  # only prefilled, then copied in: a buffer set of its own
            return make_static(session, compile=running.compile, pooled=False)
        return session

    def step(self) -> list[FinishedImage]:
        """One iteration for every image in the batch; returns the images it completed (they leave).

        Raises:
            ValueError: non-finite logits (as ``generate``). Whatever the model raises. After an
                exception the batch is broken: open a new one.
        """
        loop = self._loop
        if self.size == 0:
            return []
        if self.N == 1:  # each image's prefill made its one token: they leave without a forward
            alive = torch.zeros(0, dtype=torch.long)
        else:
            loop._mark = time.perf_counter()
            self.rows_fed += self.size
            alive = loop._advance()
            self.forwards += 1
            self.iterations += 1
        if len(loop.widths) > 2 * self.KEEP_WIDTHS:  # a server runs for days: keep the recent widths only
            del loop.widths[: len(loop.widths) - self.KEEP_WIDTHS]
        A = self.size
        if len(alive) == A:
            return []
        done = torch.ones(A, dtype=torch.bool)
        done[alive] = False
        finished_slots = loop.active_host[done].tolist()
        stats = loop._image_stats(finished_slots)
        pick = torch.tensor(finished_slots, dtype=torch.long, device=loop.device)
        tokens = loop.tokens[pick, : self.N].cpu()
        finished = [FinishedImage(self._handles[s], tokens[j], stats[j]) for j, s in enumerate(finished_slots)]
        self._leave(alive)
        return finished

    def cancel(self, handles: Sequence[int]) -> None:
        """Remove images from the batch now (unknown handles are ignored).

        Args:
            handles: a list of the integer handles :meth:`admit` returned.

        Raises:
            ValueError: ``handles`` not a list of integers (one bare handle, ``cancel(5)``, is given as ``[5]``;
                a string handle is no handle, and was ignored as unknown).
        """
        if (isinstance(handles, (str, bytes)) or not isinstance(handles, Iterable)
                or (isinstance(handles, torch.Tensor) and handles.dim() == 0)):
            raise ValueError(f"handles={handles!r}: allowed a list of the handles admit() returned, e.g. [{handles!r}]")
        handles = list(handles)
        bad = next((h for h in handles if as_integer(h) is None), None)
        if bad is not None:
            raise ValueError(f"handle {bad!r}: allowed the integer handles admit() returned")
        gone = {as_integer(h) for h in handles}
        rows = [r for r, h in enumerate(self.handles) if h not in gone]
        if len(rows) < self.size:
            self._leave(torch.tensor(rows, dtype=torch.long))

    # -- buffers ---------------------------------------------------------------------------------------

    def _leave(self, alive: torch.Tensor) -> None:
        """Keep the session rows ``alive`` (``[A']`` int64 CPU): the others leave the session and the buffers."""
        loop = self._loop
        if len(alive):
            loop.session.select_rows(alive)
            loop._select(alive)
        else:
            release = getattr(loop.session, "release", None)
            if release is not None:  # a static session gives its buffers (and compiled steps) back to the model
                release()
            loop.session = None
            loop.active_host = loop.active_host[:0]
            loop.active = loop.active[:0]
        self._keep(loop.active_host)

    def _grow(self, k: int) -> None:
        """Append ``k`` fresh rows to every per-image buffer (not yet in the session)."""
        loop = self._loop
        old = {name: getattr(loop, name) for name in loop.ROW_BUFFERS}
        B0 = loop.B
        loop._allocate(k)
        for name in loop.ROW_BUFFERS:
            setattr(loop, name, torch.cat([old[name], getattr(loop, name)]))
        loop.B = B0 + k

    def _truncate(self, B: int) -> None:
        """Drop the buffer rows after the first ``B`` (rows :meth:`_grow` added for an admission that failed)."""
        loop = self._loop
        for name in loop.ROW_BUFFERS:
            setattr(loop, name, getattr(loop, name)[:B])
        loop.B = B

    def _keep(self, slots: torch.Tensor) -> None:
        """Keep only the buffer rows ``slots`` (``[A]`` int64 CPU, the session's rows in order), so that
        buffer row ``r`` is session row ``r`` again."""
        loop = self._loop
        pick = slots.to(loop.device)
        for name in loop.ROW_BUFFERS:
            setattr(loop, name, getattr(loop, name)[pick])
        loop.committed_host = loop.committed_host[slots]
        self._handles = [self._handles[s] for s in slots.tolist()]
        loop.B = len(slots)
        loop.active = torch.arange(len(slots), device=loop.device)
        loop.active_host = torch.arange(len(slots))
