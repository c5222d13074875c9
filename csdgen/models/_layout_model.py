"""What the layout-driven Chameleon-style models share (Lumina-mGPT, Anole: :mod:`csdgen.models.chameleon`;
Lumina-mGPT 2.0: :mod:`csdgen.models.lumina2`): prompt rows built by a layout, the session over
``[cond rows; uncond rows]`` sharing ids, the memory estimate, decoding with the family's decoder.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from transformers import ChameleonConfig, ChameleonForConditionalGeneration, DynamicCache

from ._conditions import check_conditions
from ._ragged import RaggedSession
from ._transformers import (
    cache_kwargs, check_sequence_length, format_prompt, load_tokenizer, MemoryEstimate, PaddedRows, parameter_count,
)

__all__ = ["DEFAULT_PROMPT_LENGTH", "LayoutPrompts", "LayoutImageModel", "encode_prompts"]

#: prompt tokens the memory check assumes when the prompts are not known
DEFAULT_PROMPT_LENGTH = 128


class LayoutPrompts:
    """Prompt rows of a checkpoint whose rows a layout builds (Lumina-mGPT, Anole, Lumina-mGPT 2.0): the
    methods below read ``layout``, ``config``, ``tokenizer``, ``prompt_template`` and ``pixel_size``,
    which the subclass's ``__init__`` sets (:class:`ChameleonPrompts`, :class:`~csdgen.models.lumina2.Lumina2Prompts`)."""

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, **kwargs):
        """From a checkpoint folder's config and tokenizer (no weights read)."""
        return cls(ChameleonConfig.from_pretrained(folder), tokenizer=load_tokenizer(folder), **kwargs)

    def prompt_ids(self, conditions: Sequence[str | Sequence[int]]) -> list[list[int]]:
        """Token ids of each prompt (without BOS): strings through the template and the tokenizer, id lists as given.

        Raises:
            ValueError: empty list, a string with no tokenizer, or ids outside the vocabulary.
        """
        return encode_prompts(conditions, self.tokenizer, self.prompt_template, self.pixel_size,
                              self.config.vocab_size)

    def prompt_rows(self, conditions: Sequence[str | Sequence[int]]) -> tuple[list[list[int]], list[list[int]]]:
        """``(cond rows, uncond rows)``: the ids each row of a guided run reads before image token 0 (padding and hidden tokens left out)."""
        prompts = self.prompt_ids(conditions)
        cond = [self.layout.prefix(p) for p in prompts]
        uncond = [[t for t, v in zip(row, self.layout.uncond_visible(len(p))) if v] for row, p in zip(cond, prompts)]
        return cond, uncond

    def check_length(self, prompt_length: int) -> None:
        """Refuse a prompt of ``prompt_length`` tokens too long for ``max_position_embeddings`` with the image.

        Raises:
            ValueError: naming both lengths and the longest prompt allowed.
        """
        check_sequence_length(prompt_length, self.layout.image_length, self.config.max_position_embeddings)

    def prompt_length(self, conditions: Sequence[str | Sequence[int]]) -> int:
        """Tokens of the longest prompt row before begin-of-image (BOS and template included)."""
        return 1 + max(len(p) for p in self.prompt_ids(conditions))


class LayoutImageModel:
    """What a layout-driven Chameleon-style model (:class:`~csdgen.models.chameleon.ChameleonImageModel`,
    :class:`~csdgen.models.lumina2.Lumina2ImageModel`) does the same way: the backbone's image rows,
    the memory estimate (the subclass's :attr:`memory_function`), a session
    (:class:`_ChameleonSession`) and decoding with its decoder ``vqgan``.

    Attributes:
        memory_function: ``(config, layout, window, dtype, guided, prompt_length, parameters) ->
            MemoryEstimate`` of the family (:func:`~csdgen.models.chameleon.config_memory`, :func:`~csdgen.models.lumina2.lumina2_memory`).
        no_decoder: the :class:`NotImplementedError` message of :meth:`decode_images` without a decoder.
    """

    memory_function = None  # set by each family
    no_decoder = "no image decoder was loaded"

    def _set_backbone(self, backbone: ChameleonForConditionalGeneration, image_ids: torch.Tensor) -> None:
        """Backbone, device, dtype, image vocabulary ``image_ids`` ``[V]`` (vocabulary id per code), grid and
        the image rows of the LM head ``image_head`` ``[V, hidden]``."""
        self.backbone = backbone.eval()
        self.device = next(backbone.parameters()).device
        self.dtype = next(backbone.parameters()).dtype
        self.image_ids = image_ids.to(self.device)
        self.codebook_size = len(self.image_ids)
        self.grid = (self.layout.rows, self.layout.cols)
        self.num_image_tokens = self.layout.num_image_tokens
        with torch.no_grad():
            self.image_head = backbone.lm_head.weight[self.image_ids].detach()

    def memory(self, window: int, guided: bool = True, prompt_length: int = DEFAULT_PROMPT_LENGTH) -> MemoryEstimate:
        """:attr:`memory_function` of this model (its dtype and parameter count)."""
        return self.memory_function(self.backbone.config, self.layout, window, self.dtype, guided, prompt_length,
                                    parameter_count(self.backbone))

    def memory_estimate(self, batch_size: int, window: int, dtype: torch.dtype | str | None = None, guided: bool = True,
                        prompt_length: int = DEFAULT_PROMPT_LENGTH) -> int:
        """Bytes for ``batch_size`` images, see :attr:`memory_function`."""
        return self.memory_function(self.backbone.config, self.layout, window, dtype or self.dtype, guided, prompt_length,
                                    parameter_count(self.backbone)).bytes(batch_size)

    def start(self, conditions, batch_size, guided):
        """Open a session; refuses a prompt too long for ``max_position_embeddings`` before any forward.

        Raises:
            ValueError: bad conditions, ``batch_size`` differing from their number, a too-long prompt.
        """
        prompts = [[] for _ in range(batch_size or 1)] if conditions is None else self.prompt_ids(conditions)
        if batch_size is not None and batch_size != len(prompts):
            raise ValueError(f"batch_size={batch_size} differs from the {len(prompts)} conditions given")
        self.check_length(1 + max(len(p) for p in prompts))
        return _ChameleonSession(self, prompts, guided)  # layout-driven, one forward for all rows

    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens ``[B, N]`` int64 -> ``[B, 3, rows*f, cols*f]`` float32 in [-1, 1] (f: the decoder's
        downsampling, 16 for Chameleon's VQGAN, 8 for MoVQGAN).

        Raises:
            NotImplementedError: no decoder was loaded. ValueError: wrong shape.
        """
        if self.vqgan is None:
            raise NotImplementedError(self.no_decoder)
        if tokens.ndim != 2 or tokens.shape[1] != self.num_image_tokens:
            raise ValueError(f"tokens of shape {tuple(tokens.shape)}: expected [B, {self.num_image_tokens}]")
        with torch.no_grad():
            return self.vqgan.decode(tokens.reshape(-1, *self.grid))


def encode_prompts(conditions: Sequence[str | Sequence[int]], tokenizer: Any, template: str, pixel_size: tuple[int, int],
                   vocab_size: int) -> list[list[int]]:
    """Prompt strings (template, tokenizer without special tokens) or id lists -> ids without BOS.

    Raises:
        ValueError: empty list, a string with no tokenizer, or ids outside the vocabulary.
    """
    if isinstance(conditions, str) or not len(conditions):
        raise ValueError("conditions must be a non-empty list of prompt strings or token-id lists")
    check_conditions(conditions)
    out = []
    for c in conditions:
        if isinstance(c, str):
            if tokenizer is None:
                raise ValueError("string prompts need a tokenizer in the checkpoint directory; pass token-id lists instead")
            h, w = pixel_size
            c = tokenizer(format_prompt(template, c, w, h), add_special_tokens=False)["input_ids"]
        ids = [int(t) for t in c]
        if any(not 0 <= t < vocab_size for t in ids):
            raise ValueError(f"prompt token ids must be in 0..{vocab_size - 1}")
        out.append(ids)
    return out


class _ChameleonSession(RaggedSession):
    """Per-row KV-cached session over ``[cond rows; uncond rows]`` sharing ids; see :mod:`csdgen.models.chameleon`'s module docstring."""

    def __init__(self, model: "LayoutImageModel", prompts: list[list[int]], guided: bool):
        self.model, self.layout = model, model.layout
        prefixes = [self.layout.prefix(p) for p in prompts]
        visible = [[True] * len(p) for p in prefixes]
        if guided:
            prefixes, visible = prefixes * 2, visible + [self.layout.uncond_visible(len(q)) for q in prompts]
        self.rows = PaddedRows(prefixes, self.layout.pad, model.device, visible)
        self.prefix_length = self.rows.width
        self.prefix_ids, self.prefix_mask = self.rows.ids, self.rows.mask
        super().__init__(batch_size=len(prompts), guided=guided, cache=DynamicCache(config=model.backbone.config),
                         prompt_ids=self.rows.ids, prompt_valid=self.rows.mask, num_image_tokens=model.num_image_tokens,
                         device=model.device, cols=self.layout.cols, row_end=self.layout.newline, filler=self.layout.pad)

    def _vocab_ids(self, tokens):
        return self.model.image_ids[tokens]

    def _logits(self, ids, attention_mask, position_ids, out, prefill):
        with torch.no_grad():
            hidden = self.model.backbone.model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids,
                                               **cache_kwargs(self.kv.cache), use_cache=True).last_hidden_state
            hidden = hidden.gather(1, out[..., None].expand(-1, -1, hidden.shape[-1]))
            return F.linear(hidden, self.model.image_head).float()  # [rows, W, V]
