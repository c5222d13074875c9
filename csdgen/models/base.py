"""The model interface the decoding engine sees: image-token positions, window logits, rollback.

The engine knows nothing of model families. It sees an image as ``N`` codebook tokens in
raster order (``grid = (rows, cols)``, ``rows * cols = N``) over a codebook of ``V``
entries, and drives a :class:`DecodingSession`:

1. :meth:`DecodingSession.prefill` runs the condition (class, prompt, ...) and returns the
   logits for image position 0;
2. :meth:`DecodingSession.forward` feeds the image tokens at positions
   ``start .. start + W - 1`` on top of the cached positions ``0 .. start - 1`` and returns
   the logits for positions ``start + 1 .. start + W``;
3. :meth:`DecodingSession.rollback` drops cached positions from ``length`` on.

A family adapter maps these positions to its own sequence (row-end tokens, special tokens,
the unconditional rows of classifier-free guidance) and back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import torch

__all__ = ["WindowLogits", "DecodingSession", "ImageTokenModel"]


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
    """The state of decoding one batch: a KV cache (or its equivalent) over image positions."""

    batch_size: int

    @abstractmethod
    def prefill(self) -> WindowLogits:
        """Run the condition prefix; return logits ``[B, 1, V]`` for image position 0."""

    @abstractmethod
    def forward(self, tokens: torch.Tensor, start: int) -> WindowLogits:
        """Feed image tokens and return the logits of the next positions.

        Args:
            tokens: ``[B, W]`` int64 codebook ids for image positions ``start .. start + W - 1``.
            start: must equal :attr:`cache_length`.

        Returns:
            logits ``[B, W, V]``; slot ``j`` is the distribution of image position ``start + j + 1``.
        """

    @abstractmethod
    def rollback(self, length: int) -> None:
        """Keep the cache of image positions ``0 .. length - 1`` only (length <= cache_length).

        Raises:
            ValueError: if ``length`` is negative or beyond the cache.
        """

    @property
    @abstractmethod
    def cache_length(self) -> int:
        """Number of image positions in the cache."""


class ImageTokenModel(ABC):
    """An image generator over codebook tokens, as the decoding engine sees it.

    Attributes:
        codebook_size: V, the number of image token ids (0 .. V - 1).
        num_image_tokens: N, tokens per image.
        grid: ``(rows, cols)`` of the raster order, ``rows * cols == N``.
        device: where the session's tensors live.
    """

    codebook_size: int
    num_image_tokens: int
    grid: tuple[int, int]
    device: torch.device = torch.device("cpu")

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
        """``[V, D]`` float codebook vectors, when the model has a tokenizer (None otherwise)."""
        return None

    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens ``[B, N]`` int64 -> images ``[B, 3, H, W]`` float32 in [-1, 1].

        Raises:
            NotImplementedError: for a model without an image decoder.
        """
        raise NotImplementedError(f"{type(self).__name__} has no image decoder")
