"""Liquid (FoundationVision, 2024): a Gemma language model that writes Chameleon VQGAN codes.

Liquid extends Gemma's vocabulary by the VQGAN's 8192 codes (``liquid/expand_vocabulary.py``:
``resize_token_embeddings(vocab_size + 8192)``), so code ``v`` is token ``len(tokenizer) + v`` of a
plain ``GemmaForCausalLM``; its images are decoded by Chameleon's VQGAN (the decoder csdgen has in
:mod:`csdgen.models.chameleon_vqgan`). 512 px = 32 x 32 codes in raster order, no row ends.

Rows, as FoundationVision/Liquid ``evaluation/inference_t2i.py`` builds them (the tokenizer
called once per row with its special tokens, so Gemma's ``<bos>`` comes first):

* cond: ``prompt + " Generate an image based on this description.<boi>"``;
* uncond: ``"<unconditional><boi>"``;

cond rows first, then uncond rows, left-padded (``padding_side='left'``) in one forward; position
ids count the real tokens only, as ``prepare_inputs_for_generation`` makes them from the mask.
The reference then guides on raw logits (``uncond + (cond - uncond) * cfg``), divides by the
temperature, keeps the top-k and top-p tokens and samples; its GenAI-Bench script
(``T2I_Eval/genaibench_generation.py``) first sets every text logit to -inf (``logits[:, :256000]``).
csdgen does the same by reading the logits of the image rows of ``lm_head`` only (column ``v`` =
code ``v``), and applies the same order (guidance, temperature, top-k, top-p). The reference guides
only when ``cfg > 1`` and otherwise samples the cond rows alone: csdgen runs any guidance scale at or
below 1 unguided too (``guides_above_1_only``; no unconditional rows).

Token-id conditions are the prompt's ids without BOS; BOS is prepended and the suffix's ids
appended (tokenised on their own: a tokenizer may merge differently across the seam than the
one-call tokenisation of a string prompt).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from transformers import DynamicCache, GemmaConfig, GemmaForCausalLM

from ._transformers import (
    cache_kwargs,
    MemoryEstimate, PaddedRows, check_checkpoint, check_sequence_length, check_token_ids, encode_each_once,
    estimate_memory, format_prompt, load_tokenizer, meta_parameter_count, parameter_count, resolve_dtype,
)
from ._conditions import check_conditions
from ._ragged import RaggedSession
from .base import ImageTokenModel
from .chameleon_vqgan import ChameleonVQGANDecoder, VQGANConfig, load_vqgan_decoder
from .defaults import FAMILY_DEFAULTS
from .quantize import load_pretrained

__all__ = ["LiquidImageModel", "LiquidPrompts", "liquid_memory", "find_vqgan", "SUFFIX", "UNCONDITIONAL", "CODEBOOK_SIZE",
           "RESOLUTION"]

#: appended to every prompt string (``inference_t2i.py``)
SUFFIX = " Generate an image based on this description.<boi>"
#: the unconditional row's text
UNCONDITIONAL = "<unconditional><boi>"
#: codes Liquid adds to the vocabulary (``expand_vocabulary.py --num_add_token``; the Chameleon VQGAN's n_embed)
CODEBOOK_SIZE = 8192
#: pixels per side of Liquid's images (the Chameleon VQGAN's resolution): 32 x 32 codes
RESOLUTION = 512
#: pixels per code along a side when no VQGAN is loaded (Chameleon's VQGAN)
DOWNSAMPLING = 16
#: prompt tokens the memory check assumes when the prompts are not known
DEFAULT_PROMPT_LENGTH = 128
#: where the VQGAN files are looked for in a checkpoint folder (Liquid's evaluation code keeps them in chameleon/)
VQGAN_FOLDERS = (".", "chameleon", "tokenizer")


def find_vqgan(folder: str | os.PathLike, vqgan_dir: str | os.PathLike | None = None) -> tuple[Path, Path] | None:
    """``(vqgan.yaml, vqgan.ckpt)`` in ``vqgan_dir``, else in the checkpoint folder, its ``chameleon/`` or ``tokenizer/``.

    Raises:
        ValueError: ``vqgan_dir`` given without both files.
    """
    if vqgan_dir is not None:
        yaml_path, ckpt_path = Path(vqgan_dir) / "vqgan.yaml", Path(vqgan_dir) / "vqgan.ckpt"
        if not (yaml_path.is_file() and ckpt_path.is_file()):
            raise ValueError(f"vqgan_dir={str(vqgan_dir)!r} lacks vqgan.yaml or vqgan.ckpt (Chameleon's tokenizer/ files)")
        return yaml_path, ckpt_path
    for sub in VQGAN_FOLDERS:
        d = Path(folder) / sub
        if (d / "vqgan.yaml").is_file() and (d / "vqgan.ckpt").is_file():
            return d / "vqgan.yaml", d / "vqgan.ckpt"
    return None


def _vqgan_config(files: tuple[Path, Path] | None) -> VQGANConfig | None:
    if files is None:
        return None
    from ._vq_decoder import read_yaml

    return VQGANConfig.from_dict(read_yaml(files[0], "Chameleon's vqgan.yaml"))


class LiquidPrompts:
    """Liquid prompt rows from the config and the tokenizer only (usable before the weights are loaded).

    Args:
        config: the ``GemmaConfig``; tokenizer: the checkpoint's (required: the rows are strings
            of the reference code); vqgan: the VQGAN's config (grid and codebook size), or None
            for Liquid's 512 px with 8192 codes.
        image_size: pixels, None or the VQGAN's resolution (Liquid makes one size).
        prompt_template: ``{prompt}``, ``{width}``, ``{height}`` applied to prompt strings first.

    Attributes:
        offset: ``len(tokenizer)``, the id of code 0 (``inference_t2i.py``: ``pred - len(tokenizer)``).
        codebook_size: ``vocab_size - offset``.

    Raises:
        ValueError: no tokenizer, a vocabulary without image rows or with another number of
            them than the VQGAN's codebook, another size, a bad template.
    """

    def __init__(self, config: GemmaConfig, tokenizer: Any, vqgan: VQGANConfig | None = None, image_size: int | None = None,
                 prompt_template: str = "{prompt}", folder: str | os.PathLike | None = None):
        if tokenizer is None:
            raise ValueError("a Liquid checkpoint needs its tokenizer (the rows are the reference's strings); "
                             "the folder has no tokenizer files")
        self.config, self.tokenizer = config, tokenizer
        self.offset = len(tokenizer)
        self.codebook_size = int(config.vocab_size) - self.offset
        expected = CODEBOOK_SIZE if vqgan is None else vqgan.n_embed
        if self.codebook_size != expected:
            what = "Liquid's 8192" if vqgan is None else f"the VQGAN's n_embed {expected}"
            where = "" if folder is None else f"{str(folder)!r}: "
            raise ValueError(f"{where}vocab_size {config.vocab_size} - len(tokenizer) {self.offset} = {self.codebook_size} "
                             f"image rows; allowed: {what} (a Gemma checkpoint without image tokens is not Liquid)")
        side, f = (RESOLUTION, DOWNSAMPLING) if vqgan is None else (vqgan.resolution, vqgan.downsampling)
        if image_size is not None and image_size != side:
            raise ValueError(f"Liquid image size {image_size}: allowed only {side} (its VQGAN's resolution)")
        self.grid = (side // f, side // f)
        self.num_image_tokens = self.grid[0] * self.grid[1]
        self.image_size = (side, side)
        self.prompt_template = prompt_template
        format_prompt(prompt_template, "", 1, 1)  # refuse a bad template now
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else config.pad_token_id
        check_sequence_length(1, self.num_image_tokens, config.max_position_embeddings, f"{side}x{side} image")

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, vqgan_dir: str | os.PathLike | None = None, **kwargs) -> "LiquidPrompts":
        """From a checkpoint folder's config, tokenizer and VQGAN config (no weights read)."""
        config = GemmaConfig.from_pretrained(check_checkpoint(folder, "Liquid"))
        return cls(config, load_tokenizer(folder), _vqgan_config(find_vqgan(folder, vqgan_dir)), folder=folder, **kwargs)

    def cond_ids(self, condition: str | Sequence[int]) -> list[int]:
        """One condition -> its row: ``tokenizer(prompt + SUFFIX)`` for a string, ``[BOS] + ids + tokenizer(SUFFIX)`` for ids.

        Raises:
            ValueError: ids outside the vocabulary.
        """
        if isinstance(condition, str):
            h, w = self.image_size
            return list(self.tokenizer(format_prompt(self.prompt_template, condition, w, h) + SUFFIX)["input_ids"])
        ids = check_token_ids(condition, self.config.vocab_size)
        return [self.tokenizer.bos_token_id, *ids, *self.tokenizer(SUFFIX, add_special_tokens=False)["input_ids"]]

    def uncond_ids(self) -> list[int]:
        """The unconditional row, ``tokenizer("<unconditional><boi>")``."""
        return list(self.tokenizer(UNCONDITIONAL)["input_ids"])

    def prompt_rows(self, conditions: Sequence[str | Sequence[int]]) -> tuple[list[list[int]], list[list[int]]]:
        """``(cond rows, uncond rows)``: the ids each row of a guided run reads before image token 0."""
        if isinstance(conditions, str) or not len(conditions):
            raise ValueError("conditions must be a non-empty list of prompt strings or token-id lists")
        cond = encode_each_once(self.cond_ids, check_conditions(conditions))
        return cond, [self.uncond_ids()] * len(cond)

    def check_length(self, prompt_length: int) -> None:
        """Refuse a prompt row too long for ``max_position_embeddings`` with the image.

        Raises:
            ValueError: naming both lengths and the longest prompt allowed.
        """
        check_sequence_length(prompt_length, self.num_image_tokens, self.config.max_position_embeddings)

    def prompt_length(self, conditions: Sequence[str | Sequence[int]]) -> int:
        """Tokens of the longest row (cond or uncond) before the first image token."""
        cond, uncond = self.prompt_rows(conditions)
        return max(len(r) for r in cond + uncond)


def liquid_memory(config: GemmaConfig, num_image_tokens: int, codebook_size: int, window: int, dtype: torch.dtype | str,
                  guided: bool = True, prompt_length: int = DEFAULT_PROMPT_LENGTH,
                  parameters: int | None = None) -> MemoryEstimate:
    """Memory of a run (:func:`~csdgen.models._transformers.estimate_memory`): sequence = ``prompt_length + N``.

    ``parameters`` default: counted on the ``meta`` device (Liquid-7B: Gemma-7B with 264192 embedding rows).
    """
    size = torch.empty((), dtype=resolve_dtype(dtype)).element_size()
    count = meta_parameter_count(GemmaForCausalLM, config) if parameters is None else parameters
    return estimate_memory(count, size, config, prompt_length + num_image_tokens, codebook_size, window, guided,
                           image_tokens=num_image_tokens)


class LiquidImageModel(LiquidPrompts, ImageTokenModel):
    """Liquid text-to-image generation over a ``GemmaForCausalLM``; images by the Chameleon VQGAN.

    Args:
        backbone: the loaded Gemma model (eval mode is set here); tokenizer: its tokenizer.
        vqgan: a :class:`ChameleonVQGANDecoder` (None: no :meth:`decode_images`, 512 px / 8192 codes assumed).
        prompt_template: see :class:`LiquidPrompts`.

    Attributes:
        defaults: the ``liquid`` row of ``FAMILY_DEFAULTS``.
        guides_above_1_only: True: a guidance scale at or below 1 runs unguided, as the reference does.
    """

    guides_above_1_only = True

    def __init__(self, backbone: GemmaForCausalLM, tokenizer: Any, vqgan: ChameleonVQGANDecoder | None = None,
                 image_size: int | None = None, prompt_template: str = "{prompt}"):
        LiquidPrompts.__init__(self, backbone.config, tokenizer, None if vqgan is None else vqgan.config, image_size,
                               prompt_template)
        self.backbone, self.vqgan = backbone.eval(), vqgan
        self.defaults = FAMILY_DEFAULTS["liquid"]
        self.device = next(backbone.parameters()).device
        self.dtype = next(backbone.parameters()).dtype
        self.head = backbone.lm_head.weight.detach().narrow(0, self.offset, self.codebook_size)  # [V, hidden]

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: torch.dtype | str = torch.float32,
                        device: str | torch.device = "cpu", vqgan_dir: str | os.PathLike | None = None,
                        image_size: int | None = None, prompt_template: str = "{prompt}") -> "LiquidImageModel":
        """Load a local Liquid folder (``Junfeng5/Liquid_V1_7B`` layout), its tokenizer, and the Chameleon VQGAN if found.

        Args:
            vqgan_dir: folder of ``vqgan.yaml`` + ``vqgan.ckpt``; default: the checkpoint folder,
                its ``chameleon/`` or ``tokenizer/`` when one holds both, else no decoder.

        Raises:
            FileNotFoundError: missing folder, config or weights.
            ValueError: no tokenizer, vocabulary/VQGAN mismatch, size, dtype or template (before the weights are read).
        """
        folder = check_checkpoint(path, "Liquid")
        dtype = resolve_dtype(dtype)
        tokenizer = load_tokenizer(folder)
        files = find_vqgan(folder, vqgan_dir)
        LiquidPrompts(GemmaConfig.from_pretrained(folder), tokenizer, _vqgan_config(files), image_size, prompt_template,
                      folder=path)
        vqgan = None if files is None else load_vqgan_decoder(str(files[0]), str(files[1]), device=device)  # before the weights
        backbone = load_pretrained(GemmaForCausalLM, folder, dtype=dtype, device=device)
        return cls(backbone, tokenizer, vqgan, image_size, prompt_template)

    def start(self, conditions, batch_size, guided):
        """Open a session; refuses a row too long for ``max_position_embeddings`` before any forward.

        Raises:
            ValueError: bad conditions, ``batch_size`` differing from their number, a too-long prompt.
        """
        if conditions is None:
            raise ValueError("Liquid needs prompts: a non-empty list of prompt strings or token-id lists")
        cond, uncond = self.prompt_rows(conditions)
        if batch_size is not None and batch_size != len(cond):
            raise ValueError(f"batch_size={batch_size} differs from the {len(cond)} conditions given")
        rows = cond + uncond if guided else cond
        self.check_length(max(len(r) for r in rows))
        return _LiquidSession(self, rows, len(cond), guided)

    def memory(self, window: int, guided: bool = True, prompt_length: int = DEFAULT_PROMPT_LENGTH) -> MemoryEstimate:
        """:func:`liquid_memory` of this model (its dtype and parameter count)."""
        return liquid_memory(self.config, self.num_image_tokens, self.codebook_size, window, self.dtype, guided,
                             prompt_length, parameter_count(self.backbone))

    def codebook_embeddings(self) -> torch.Tensor | None:
        """``[V, D]`` float32: the VQGAN's codebook (None without a VQGAN)."""
        return None if self.vqgan is None else self.vqgan.quantize.embedding.weight.detach().float()

    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens ``[B, N]`` -> ``[B, 3, 512, 512]`` float32 in [-1, 1] (the VQGAN's resolution).

        Raises:
            NotImplementedError: no VQGAN. ValueError: wrong shape.
        """
        if self.vqgan is None:
            raise NotImplementedError("no VQGAN decoder: give vqgan_dir= with Chameleon's vqgan.yaml and vqgan.ckpt")
        if tokens.ndim != 2 or tokens.shape[1] != self.num_image_tokens:
            raise ValueError(f"tokens of shape {tuple(tokens.shape)}: expected [B, {self.num_image_tokens}]")
        with torch.no_grad():
            return self.vqgan.decode(tokens.reshape(-1, *self.grid))


class _LiquidSession(RaggedSession):
    """Per-row KV-cached session over ``[cond rows; uncond rows]`` (left-padded), no row ends."""

    def __init__(self, model: LiquidImageModel, rows: list[list[int]], batch_size: int, guided: bool):
        self.model = model
        self.rows = PaddedRows(rows, model.pad_id, model.device)
        super().__init__(batch_size=batch_size, guided=guided, cache=DynamicCache(config=model.config),
                         prompt_ids=self.rows.ids, prompt_valid=self.rows.mask, num_image_tokens=model.num_image_tokens,
                         device=model.device, filler=model.pad_id)

    def _vocab_ids(self, tokens):
        return tokens + self.model.offset

    def _logits(self, ids, attention_mask, position_ids, out, prefill):
        with torch.no_grad():
            hidden = self.model.backbone.model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids,
                                               **cache_kwargs(self.kv.cache), use_cache=True).last_hidden_state
            hidden = hidden.gather(1, out[..., None].expand(-1, -1, hidden.shape[-1]))
            return F.linear(hidden, self.model.head).float()  # [rows, W, V]
