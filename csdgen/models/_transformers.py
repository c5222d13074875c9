"""Pieces shared by the adapters built on transformers (Janus, Emu3, Chameleon, the class-conditional Llama).

* :func:`resolve_dtype`, :data:`DTYPES`: the dtypes a checkpoint may be loaded in;
* :func:`check_checkpoint`, :data:`WEIGHT_FILES`: a local transformers checkpoint folder;
* :func:`left_pad`: a batch of prompts of different lengths;
* :func:`kv_cache_bytes`, :func:`parameter_count`, :func:`meta_parameter_count`: memory estimates;
* :class:`CachedSession`: ``rollback`` / ``cache_length`` over a transformers ``DynamicCache``,
  with :meth:`CachedSession.sequence_length` mapping image positions to cached sequence
  positions (for layouts with row-end tokens).

Only torch is imported here (no transformers model code).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .base import DecodingSession, WindowLogits

__all__ = [
    "DTYPES",
    "WEIGHT_FILES",
    "resolve_dtype",
    "check_checkpoint",
    "left_pad",
    "kv_cache_bytes",
    "parameter_count",
    "meta_parameter_count",
    "CachedSession",
]

#: dtype names accepted wherever a checkpoint is loaded
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: weight files of a transformers checkpoint folder (``*.safetensors`` shards count too)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A name of :data:`DTYPES` or one of its torch dtypes -> the torch dtype.

    Raises:
        ValueError: any other dtype.
    """
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype={dtype!r}: allowed {', '.join(DTYPES)} (or the torch dtypes)")


def check_checkpoint(path: str | os.PathLike, family: str) -> Path:
    """Raise FileNotFoundError unless ``path`` is a folder with config.json and weights.

    Args:
        path: the folder; family: the family's name for the messages (``"Janus"``, ``"Emu3"``).
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{family} checkpoint folder {str(path)!r} does not exist (give a local folder; no downloads)")
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{str(path)!r} has no config.json: not a transformers {family} checkpoint")
    if not any((folder / name).is_file() for name in WEIGHT_FILES) and not any(folder.glob("*.safetensors")):
        raise FileNotFoundError(f"{str(path)!r} holds no weights; expected one of {', '.join(WEIGHT_FILES)}")
    return folder


def left_pad(rows: list[list[int]], pad: int, device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists: ``([R, P] int64 ids, [R, P] int64 mask)``, 1 on the real tokens."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
    return ids, mask


def kv_cache_bytes(text_config: Any, rows: int, length: int, element_size: int) -> int:
    """Bytes of a KV cache: ``layers * 2 * rows * length * kv_heads * head_dim * element_size``.

    ``head_dim`` is the config's, else ``hidden_size // num_attention_heads``; ``kv_heads`` is
    ``num_key_value_heads``, else ``num_attention_heads``.
    """
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    kv_heads = getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
    return text_config.num_hidden_layers * 2 * rows * length * kv_heads * head_dim * element_size


def parameter_count(model: torch.nn.Module) -> int:
    """Number of parameters (elements) of ``model``."""
    return sum(p.numel() for p in model.parameters())


def meta_parameter_count(model_class: type, config: Any) -> int:
    """Parameters of ``model_class(config)``, built on the ``meta`` device (nothing allocated)."""
    with torch.device("meta"):
        return parameter_count(model_class(config))


class CachedSession(DecodingSession):
    """A session over a transformers ``DynamicCache``: ``rollback`` and ``cache_length``.

    Subclasses set ``self.cache`` (the ``DynamicCache``), ``self.batch_size``, ``self.guided``
    and ``self._length`` (image positions cached; -1 before prefill), and override
    :meth:`sequence_length` when the cached sequence holds more than the image positions
    (row-end tokens): rollback drops the difference of the two sequence lengths.
    """

    cache: Any
    guided: bool
    _length: int = -1

    def sequence_length(self, image_length: int) -> int:
        """Cached sequence length holding ``image_length`` image positions, up to a constant offset."""
        return image_length

    def _check_start(self, start: int) -> None:
        if start != self._length:
            raise ValueError(f"start={start} but the session holds {self._length} image positions")

    def _window_logits(self, logits: torch.Tensor) -> WindowLogits:
        """``[R, W, V]`` logits of all rows -> cond rows, then (guided) uncond rows."""
        if self.guided:
            return WindowLogits(logits[: self.batch_size], logits[self.batch_size :])
        return WindowLogits(logits, None)

    def rollback(self, length):
        if not 0 <= length <= self._length:
            raise ValueError(f"rollback length={length}: allowed 0..{self._length}")
        drop = self.sequence_length(self._length) - self.sequence_length(length)
        if drop:
            self.cache.crop(-drop)  # transformers 5.24 accepts only a negative count here
        self._length = length

    @property
    def cache_length(self):
        return self._length
