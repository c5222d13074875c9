"""FunctionModel: any ``prefix -> next-token logits`` function as an image-token model.

For tests, teaching, and checking your own model with the engine before writing an adapter.
It has no cache: every window position is one call of the function on its whole prefix, so it
is slow, and exactly as correct as the function.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .base import DecodingSession, ImageTokenModel, WindowLogits

__all__ = ["FunctionModel"]

LogitsFn = Callable[[torch.Tensor], torch.Tensor]


class FunctionModel(ImageTokenModel):
    """Wrap ``fn(prefix) -> logits``.

    Args:
        fn: maps a token prefix ``[B, t]`` int64 (``0 <= t < N``, image tokens only) to
            next-token logits ``[B, V]`` float.
        num_image_tokens: N.
        codebook_size: V.
        uncond_fn: the unconditional counterpart of ``fn`` for classifier-free guidance
            (None: the model cannot be guided).
        grid: ``(rows, cols)``; default ``(1, N)``.

    Raises:
        ValueError: non-positive sizes, or a grid whose product is not N.
    """

    def __init__(
        self,
        fn: LogitsFn,
        num_image_tokens: int,
        codebook_size: int,
        uncond_fn: LogitsFn | None = None,
        grid: tuple[int, int] | None = None,
    ):
        if num_image_tokens < 1 or codebook_size < 1:
            raise ValueError(f"num_image_tokens={num_image_tokens}, codebook_size={codebook_size}: both must be >= 1")
        self.fn, self.uncond_fn = fn, uncond_fn
        self.num_image_tokens, self.codebook_size = num_image_tokens, codebook_size
        self.grid = grid or (1, num_image_tokens)
        if self.grid[0] * self.grid[1] != num_image_tokens:
            raise ValueError(f"grid={self.grid} does not hold num_image_tokens={num_image_tokens}")

    def start(self, conditions: Any, batch_size: int | None, guided: bool) -> DecodingSession:
        if batch_size is None or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: FunctionModel needs an explicit batch_size >= 1")
        if guided and self.uncond_fn is None:
            raise ValueError("guidance requested, but this FunctionModel has no uncond_fn; use guidance_scale=1")
        return _FunctionSession(self, batch_size, guided)


class _FunctionSession(DecodingSession):
    def __init__(self, model: FunctionModel, batch_size: int, guided: bool):
        self.model, self.batch_size, self.guided = model, batch_size, guided
        self.prefix = torch.zeros(batch_size, 0, dtype=torch.long, device=model.device)

    def _logits(self, prefixes: list[torch.Tensor]) -> WindowLogits:
        cond = torch.stack([self.model.fn(p) for p in prefixes], dim=1)
        uncond = torch.stack([self.model.uncond_fn(p) for p in prefixes], dim=1) if self.guided else None
        return WindowLogits(cond, uncond)

    def prefill(self) -> WindowLogits:
        return self._logits([self.prefix])

    def forward(self, tokens: torch.Tensor, start: int) -> WindowLogits:
        if start != self.cache_length:
            raise ValueError(f"start={start} but the session holds {self.cache_length} positions")
        self.prefix = torch.cat([self.prefix, tokens], dim=1)
        return self._logits([self.prefix[:, : start + j + 1] for j in range(tokens.shape[1])])

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.cache_length:
            raise ValueError(f"rollback length={length}: allowed 0..{self.cache_length}")
        self.prefix = self.prefix[:, :length]

    @property
    def cache_length(self) -> int:
        return self.prefix.shape[1]
