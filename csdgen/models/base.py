"""The model interface the decoding engine sees: image-token positions, window logits, rollback.

The engine knows nothing of model families. It sees an image as ``N`` codebook tokens in
raster order (``grid = (rows, cols)``, ``rows * cols = N``) over a codebook of ``V``
entries, and drives a :class:`DecodingSession` over a batch of images, **each image at its own
position** (per-row windows):

1. :meth:`DecodingSession.prefill` runs the condition (class, prompt, ...) and returns the
   logits for image position 0;
2. :meth:`DecodingSession.forward` feeds, for every image ``b``, the image tokens at positions
   ``start[b] .. start[b] + widths[b] - 1`` on top of its cached positions
   ``0 .. start[b] - 1`` and returns the logits for positions ``start[b] + 1 ..``;
3. :meth:`DecodingSession.rollback` keeps, for every image ``b``, positions
   ``0 .. lengths[b] - 1``;
4. :meth:`DecodingSession.select_rows` drops the images the engine has finished;
5. :meth:`DecodingSession.admit` (continuous batching, sessions with ``supports_admission``)
   appends the rows of another, prefilled session: images that join a running batch between
   two iterations, each row keeping its own positions and cache length.

Per-row arguments (``start``, ``widths``, ``lengths``, ``rows``) are ``[B]`` int64 **CPU**
tensors: the engine reads them from its one host sync per iteration, so a session can do its
bookkeeping (masks, cache crops) on the host without another sync.

A family adapter maps these positions to its own sequence (row-end tokens, special tokens,
the unconditional rows of classifier-free guidance) and back; :mod:`csdgen.models._ragged`
does the per-row KV-cache bookkeeping for adapters over a transformers ``DynamicCache``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

if TYPE_CHECKING:
    from ..guidance import GuidanceSchedule
    from .defaults import FamilyDefaults

__all__ = ["WindowLogits", "DecodingSession", "ImageTokenModel", "CodebookUnavailable", "optional_codebook",
           "check_row_arguments", "row_tensor"]


class CodebookUnavailable(ValueError):
    """A model has a VQ codebook but cannot give it (e.g. the checkpoint's files lack it); the
    message says why and how to supply it. Raised by :meth:`ImageTokenModel.codebook_embeddings`."""


class WindowLogits(NamedTuple):
    """Logits of one forward, before guidance and warping.

    Attributes:
        cond: ``[B, W, V]`` float, the conditional rows.
        uncond: ``[B, W, V]`` float, the unconditional rows of the same forward, or None when
            guidance is off.
    """

    cond: torch.Tensor
    uncond: torch.Tensor | None


class DecodingSession(ABC):
    """The state of decoding one batch: a KV cache (or its equivalent) per image.

    Attributes:
        batch_size: B, the images (rows) the session holds now (it shrinks with
            :meth:`select_rows`).
    """

    batch_size: int

    @abstractmethod
    def prefill(self) -> WindowLogits:
        """Run the condition prefix; return logits ``[B, 1, V]`` for image position 0."""

    @abstractmethod
    def forward(self, tokens: torch.Tensor, start: torch.Tensor, widths: torch.Tensor | None = None) -> WindowLogits:
        """Feed image tokens, each image at its own position, and return the next positions' logits.

        Args:
            tokens: ``[B, W]`` int64 codebook ids; row ``b``'s slot ``j`` is image position
                ``start[b] + j``.
            start: ``[B]`` int64 CPU; ``start[b]`` must equal row ``b``'s cached length.
            widths: ``[B]`` int64 CPU in ``0 .. W`` (None: all ``W``): row ``b`` feeds only its
                first ``widths[b]`` slots; the others are padding (their tokens are not read and
                not cached, their logits are undefined). ``start[b] + widths[b] <= N - 1``.

        Returns:
            logits ``[B, W, V]``; slot ``j`` of row ``b`` is the distribution of image position
            ``start[b] + j + 1``. Afterwards row ``b`` caches ``start[b] + widths[b]`` positions.

        Raises:
            ValueError: a ``start`` that is not the row's cached length, or a window past the image.
        """

    @abstractmethod
    def rollback(self, lengths: torch.Tensor) -> None:
        """Keep the cache of image positions ``0 .. lengths[b] - 1`` of every row ``b``.

        Args:
            lengths: ``[B]`` int64 CPU, ``0 <= lengths[b] <= cache_lengths[b]``.

        Raises:
            ValueError: if a length is negative or beyond the row's cache.
        """

    @abstractmethod
    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the given rows (in that order) and free the others.

        Args:
            rows: ``[B']`` int64 CPU, distinct indices into the current rows.
        """

    @property
    @abstractmethod
    def cache_lengths(self) -> torch.Tensor:
        """``[B]`` int64 CPU: image positions cached per row."""

    #: whether :meth:`admit` is implemented (continuous batching, :class:`csdgen.engine.ContinuousBatch`)
    supports_admission: bool = False

    def admit(self, other: "DecodingSession") -> None:
        """Append the rows of ``other`` after this session's rows (images joining a running batch).

        ``other`` is a session of the same model opened with the same ``guided``
        (``model.start(conditions, len(conditions), guided)``) and prefilled (its rows hold 0 image
        positions, their logits for position 0 already returned); this session may be anywhere
        in its decode. Afterwards this session's rows are its ``B`` old rows (unchanged: same
        cache, positions and lengths), then ``other``'s ``B'`` rows: ``batch_size == B + B'``,
        ``cache_lengths == cat(old cache_lengths, other.cache_lengths)``, and the next
        :meth:`forward` takes ``[B + B', W]`` tokens with every row at its own ``start``.
        ``other`` is consumed (not used afterwards).

        Args:
            other: a prefilled session of the same model and guidance, with ``supports_admission``.

        Raises:
            ValueError: ``other`` is not prefilled, of another kind, model or guidance.
            NotImplementedError: this session cannot admit rows (``supports_admission`` False).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot admit rows into a running batch")


def row_tensor(values: Any, batch_size: int) -> torch.Tensor:
    """``[batch_size]`` int64 CPU tensor from a tensor, a sequence, or one int (the same for every row)."""
    values = torch.as_tensor(values, dtype=torch.long).cpu()
    return values.expand(batch_size).clone() if values.dim() == 0 else values.reshape(-1)


def check_row_arguments(name: str, values: torch.Tensor, batch_size: int, low: int | torch.Tensor, high: int | torch.Tensor) -> None:
    """Raise ValueError unless ``values`` is ``[batch_size]`` with ``low <= values <= high`` (element-wise).

    A helper for sessions checking ``start`` / ``widths`` / ``lengths`` (host tensors: no device sync).
    """
    if values.shape != (batch_size,):
        raise ValueError(f"{name} has shape {tuple(values.shape)}; allowed: ({batch_size},), one per row")
    bad = (values < low) | (values > high)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        lo = int(low[row]) if isinstance(low, torch.Tensor) else low
        hi = int(high[row]) if isinstance(high, torch.Tensor) else high
        raise ValueError(f"{name}[{row}]={int(values[row])}: allowed {lo}..{hi}")


class ImageTokenModel(ABC):
    """An image generator over codebook tokens, as the decoding engine sees it.

    Attributes:
        codebook_size: V, the number of image token ids (0 .. V - 1).
        num_image_tokens: N, tokens per image.
        grid: ``(rows, cols)`` of the raster order, ``rows * cols == N``.
        device: where the session's tensors live.
        defaults: the family's decoding defaults (:class:`csdgen.models.defaults.FamilyDefaults`:
            guidance scale, temperature, top-k, lambda, delta, ...), which
            :func:`csdgen.generate` uses for every argument left None; None: the CSD reference
            values (no guidance, temperature 1, lambda 0.5, delta 0.65).
        reference_guidance: the family's guidance schedule (:class:`csdgen.guidance.GuidanceSchedule`,
            e.g. Lumina-mGPT 2.0's), which :func:`csdgen.generate` uses when ``sampling`` is left
            to the model's defaults; None: a constant scale.
        guides_above_1_only: the family's reference applies classifier-free guidance only at scales
            above 1 and runs unguided (no unconditional rows) at any scale at or below 1 (Liquid's
            ``if cfg_scale > 1``); :func:`csdgen.generate` then runs a scale <= 1 as 1.0. False: every
            scale other than 1 is guided (``(1 - s) * uncond + s * cond``).
    """

    codebook_size: int
    num_image_tokens: int
    grid: tuple[int, int]
    device: torch.device = torch.device("cpu")
    defaults: "FamilyDefaults | None" = None
    reference_guidance: "GuidanceSchedule | None" = None
    guides_above_1_only: bool = False

    @abstractmethod
    def start(self, conditions: Any, batch_size: int | None, guided: bool) -> DecodingSession:
        """Open a session for a batch.

        Args:
            conditions: what the family conditions on (class ids, prompts, ...) or None.
            batch_size: number of images when ``conditions`` does not say it.
            guided: whether unconditional rows must be run for classifier-free guidance.

        Raises:
            ValueError: for conditions the model cannot take.
        """

    def codebook_embeddings(self) -> torch.Tensor | None:
        """``[V, D]`` float codebook vectors, when the model has a tokenizer (None otherwise).

        Raises:
            CodebookUnavailable: the model has a codebook but cannot give it (the message says
                how to supply it); GSD and LANTERN then refuse with that message.
        """
        return None

    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens ``[B, N]`` int64 -> images ``[B, 3, H, W]`` float32 in [-1, 1].

        Raises:
            NotImplementedError: for a model without an image decoder.
        """
        raise NotImplementedError(f"{type(self).__name__} has no image decoder")


def optional_codebook(model: ImageTokenModel) -> torch.Tensor | None:
    """``model.codebook_embeddings()``, or None where it has none or cannot give it
    (:class:`CodebookUnavailable`): for listing the methods a model offers."""
    try:
        return model.codebook_embeddings()
    except CodebookUnavailable:
        return None
