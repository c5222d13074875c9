"""Janus / Janus-Pro (transformers ``JanusForConditionalGeneration``) as an image-token model.

Sequence layout, as ``JanusForConditionalGeneration.generate(generation_mode="image")`` builds
it (transformers 5.24, ``models/janus/modeling_janus.py``):

* cond row: the prompt ids ``[BOS, ..., <begin_of_image>]`` (``JanusProcessor(text,
  generation_mode="image")`` appends the begin-of-image token to the chat-formatted prompt);
* uncond row: the same ids with every token except BOS and begin-of-image replaced by pad;
* then ``N = vision_config.num_image_tokens`` image tokens (``sqrt(N) x sqrt(N)`` raster, no
  row-end tokens). Codebook ids ``0 .. V - 1`` are fed through
  ``prepare_embeddings_for_image_generation`` (not the text embedding) and predicted by
  ``model.model.generation_head`` (not ``lm_head``); there is no id offset.

Rows of one batch: all cond rows, then all uncond rows, in one forward of the language model.
Prompts of different lengths are left-padded with an attention mask; position ids count the
real tokens only (position 0 = the row's first real token), as for an unpadded prompt.
``generate`` numbers the pad slots too (positions ``0 .. T - 1`` whatever the mask); with
rotary (relative) position embeddings the shift changes nothing but rounding, and the tests
find the same greedy tokens for padded batches.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

import torch
from transformers import DynamicCache, JanusConfig, JanusForConditionalGeneration

from ._transformers import CachedSession, check_checkpoint, kv_cache_bytes, left_pad, meta_parameter_count, parameter_count, resolve_dtype
from .base import ImageTokenModel, WindowLogits

__all__ = ["JanusImageModel", "janus_memory_estimate", "estimate_memory_from_pretrained"]

#: prompt length assumed by memory estimates when none is given (a chat-formatted prompt of ~40 words)
DEFAULT_PROMPT_LENGTH = 64


def _grid_side(config: JanusConfig) -> int:
    """sqrt(num_image_tokens), checked against the VQ decoder's latent grid."""
    n = config.vision_config.num_image_tokens
    side = math.isqrt(n)
    if side * side != n or side != config.vq_config.num_patches:
        raise ValueError(
            f"vision_config.num_image_tokens={n} must be a square equal to vq_config.num_patches**2 = {config.vq_config.num_patches ** 2}"
        )
    return side


def janus_memory_estimate(
    config: JanusConfig, num_parameters: int, batch_size: int, window: int, dtype: torch.dtype | str,
    prompt_length: int = DEFAULT_PROMPT_LENGTH, guided: bool = True,
) -> int:
    """Bytes needed: parameters + KV cache of the full sequence + logits/probability buffers.

    KV cache: ``layers * 2 * R * (prompt_length + N) * kv_heads * head_dim`` elements of ``dtype``
    with ``R = 2B`` rows when guided (``B`` otherwise). Buffers: four ``[B, W, V]`` float32
    tensors (cond and uncond logits, target and draft probabilities).
    """
    size = torch.empty((), dtype=resolve_dtype(dtype)).element_size()
    rows = batch_size * (2 if guided else 1)
    kv = kv_cache_bytes(config.text_config, rows, prompt_length + config.vision_config.num_image_tokens, size)
    buffers = 4 * batch_size * window * config.vq_config.num_embeddings * 4
    return num_parameters * size + kv + buffers


def estimate_memory_from_pretrained(path: str | os.PathLike, batch_size: int, window: int, dtype: torch.dtype | str, **kwargs) -> int:
    """:func:`janus_memory_estimate` from a checkpoint's config.json only (weights not read).

    Parameters are counted on the ``meta`` device. Extra keyword arguments go to
    :func:`janus_memory_estimate` (``prompt_length``, ``guided``).
    """
    config = JanusConfig.from_pretrained(check_checkpoint(path, "Janus"))
    count = meta_parameter_count(JanusForConditionalGeneration, config)
    return janus_memory_estimate(config, count, batch_size, window, dtype, **kwargs)


class JanusImageModel(ImageTokenModel):
    """Text-to-image Janus / Janus-Pro over a transformers ``JanusForConditionalGeneration``.

    Args:
        model: the loaded model (eval mode is set here).
        bos_token_id, boi_token_id, pad_token_id: BOS, begin-of-image and pad ids of the text
            vocabulary (``generation_config.bos_token_id``,
            ``generation_config.generation_kwargs["boi_token_id"]``, ``pad_token_id``).
        processor: a ``JanusProcessor`` to tokenise prompt strings, or None (token ids only).
        use_chat_template: format strings with the processor's chat template (as the
            transformers Janus example does) before the begin-of-image token is appended.

    Attributes:
        image_size: the only output resolution in pixels (``grid side * 2**(levels - 1)``).
    """

    def __init__(
        self, model: JanusForConditionalGeneration, bos_token_id: int, boi_token_id: int, pad_token_id: int,
        processor: Any = None, use_chat_template: bool = True,
    ):
        self.model = model.eval()
        self.config = model.config
        side = _grid_side(self.config)
        self.grid = (side, side)
        self.num_image_tokens = side * side
        self.codebook_size = self.config.vq_config.num_embeddings
        self.image_size = side * 2 ** (len(self.config.vq_config.channel_multiplier) - 1)
        self.bos_token_id, self.boi_token_id, self.pad_token_id = bos_token_id, boi_token_id, pad_token_id
        self.processor, self.use_chat_template = processor, use_chat_template
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, dtype: torch.dtype | str = torch.float32, device: str | torch.device = "cpu",
        image_size: int | None = None, use_chat_template: bool = True,
    ) -> "JanusImageModel":
        """Load a transformers-format Janus checkpoint from a local folder (no downloads).

        The processor (tokenizer) is loaded when the folder has one; without it only token-id
        conditions are accepted.

        Args:
            path: folder with config.json, weights, generation_config.json (and processor files).
            dtype: ``torch.float32`` / ``bfloat16`` / ``float16`` or their names.
            device: where the model goes.
            image_size: optional requested resolution in pixels, checked against the checkpoint's.

        Raises:
            FileNotFoundError: no such folder, or no config / weights in it.
            ValueError: bad dtype, unsupported ``image_size``, or special token ids not found.
        """
        folder = check_checkpoint(path, "Janus")
        dtype = resolve_dtype(dtype)
        model = JanusForConditionalGeneration.from_pretrained(folder, dtype=dtype).to(device)
        processor = _load_processor(folder)
        ids = _special_ids(model, processor, folder)
        adapter = cls(model, *ids, processor=processor, use_chat_template=use_chat_template)
        adapter.check_image_size(image_size)
        return adapter

    def check_image_size(self, image_size: int | None) -> None:
        """Raise ValueError unless ``image_size`` is None or the checkpoint's resolution."""
        if image_size is not None and image_size != self.image_size:
            raise ValueError(
                f"image_size={image_size}: this Janus checkpoint makes {self.image_size} x {self.image_size} images only "
                f"({self.grid[0]} x {self.grid[1]} tokens); allowed: {self.image_size}"
            )

    def encode_conditions(self, conditions: Sequence[str | Sequence[int]]) -> list[list[int]]:
        """Prompt strings or token-id lists -> full prompt ids ending with begin-of-image.

        A string is chat-formatted (when the processor has a chat template and
        ``use_chat_template``) and tokenised by ``JanusProcessor(..., generation_mode="image")``,
        which adds BOS and appends the begin-of-image token. A list of ids is taken as it is,
        with the begin-of-image token appended when it does not end with it.

        Raises:
            ValueError: empty conditions, strings without a processor, ids outside the vocabulary.
        """
        if isinstance(conditions, (str, torch.Tensor)) or conditions is None or len(conditions) == 0:
            raise ValueError(f"conditions={conditions!r}: give a non-empty list of prompt strings or token-id lists")
        return [self._encode_text(c) if isinstance(c, str) else self._check_ids(c) for c in conditions]

    def _encode_text(self, prompt: str) -> list[int]:
        if self.processor is None:
            raise ValueError(f"prompt {prompt!r} is a string but the checkpoint has no processor/tokenizer; give token-id lists")
        text = prompt
        if self.use_chat_template and getattr(self.processor, "chat_template", None):
            messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
            text = self.processor.apply_chat_template(messages, add_generation_prompt=True)
        ids = self.processor(text=[text], generation_mode="image", return_tensors="pt")["input_ids"][0]
        return ids.tolist()

    def _check_ids(self, ids: Sequence[int]) -> list[int]:
        ids = [int(i) for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)]
        vocab = self.config.text_config.vocab_size
        if not ids or not all(0 <= i < vocab for i in ids):
            raise ValueError(f"token ids {ids[:8]}...: need a non-empty list of ids in 0..{vocab - 1}")
        return ids if ids[-1] == self.boi_token_id else ids + [self.boi_token_id]

    def uncond_ids(self, ids: list[int]) -> list[int]:
        """The unconditional row of ``generate``: all but BOS and begin-of-image become pad."""
        keep = (self.bos_token_id, self.boi_token_id)
        return [i if i in keep else self.pad_token_id for i in ids]

    def start(self, conditions, batch_size, guided, image_size: int | None = None) -> "_JanusSession":
        """Open a session; see :meth:`encode_conditions` for ``conditions``.

        Raises:
            ValueError: bad conditions, ``batch_size`` differing from their number, bad ``image_size``.
        """
        self.check_image_size(image_size)
        if conditions is None:
            raise ValueError("JanusImageModel needs conditions: a list of prompt strings or token-id lists")
        prompts = self.encode_conditions(conditions)
        if batch_size is not None and batch_size != len(prompts):
            raise ValueError(f"batch_size={batch_size} differs from the {len(prompts)} conditions given")
        return _JanusSession(self, prompts, guided)

    def memory_estimate(self, batch_size: int, window: int, dtype: torch.dtype | str | None = None,
                        prompt_length: int = DEFAULT_PROMPT_LENGTH, guided: bool = True) -> int:
        """Bytes: see :func:`janus_memory_estimate` (dtype defaults to the model's)."""
        return janus_memory_estimate(self.config, parameter_count(self.model), batch_size, window, dtype or self.dtype, prompt_length, guided)

    def codebook_embeddings(self) -> torch.Tensor:
        """``[V, D]`` float32 VQ codebook, L2-normalised as ``get_codebook_entry`` feeds the decoder."""
        weight = self.model.model.vqmodel.quantize.embedding.weight.detach().float()
        return torch.nn.functional.normalize(weight, p=2, dim=-1)

    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens ``[B, N]`` int64 -> ``[B, 3, S, S]`` float32 in [-1, 1], S = :attr:`image_size`.

        ``decode_image_tokens`` returns NHWC, unclamped; it is permuted and clamped here.
        """
        if tokens.ndim != 2 or tokens.shape[1] != self.num_image_tokens:
            raise ValueError(f"tokens of shape {tuple(tokens.shape)}: expected [B, {self.num_image_tokens}]")
        with torch.no_grad():
            images = self.model.decode_image_tokens(tokens.to(self.device))
        return images.permute(0, 3, 1, 2).float().clamp(-1, 1)


def _load_processor(folder: Path):
    """The folder's JanusProcessor, or None when it has no tokenizer files."""
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import JanusProcessor

    return JanusProcessor.from_pretrained(folder)


def _special_ids(model, processor, folder: Path) -> tuple[int, int, int]:
    """(bos, boi, pad) from the generation config, falling back to the tokenizer."""
    gen = model.generation_config
    tok = getattr(processor, "tokenizer", None)
    boi = (getattr(gen, "generation_kwargs", None) or {}).get("boi_token_id")
    if boi is None and tok is not None and getattr(tok, "boi_token", None):
        boi = tok.convert_tokens_to_ids(tok.boi_token)
    bos = gen.bos_token_id if gen.bos_token_id is not None else getattr(tok, "bos_token_id", None)
    pad = gen.pad_token_id if gen.pad_token_id is not None else getattr(tok, "pad_token_id", None)
    missing = [name for name, v in (("bos_token_id", bos), ("boi_token_id", boi), ("pad_token_id", pad)) if v is None]
    if missing:
        raise ValueError(
            f"{str(folder)!r}: {', '.join(missing)} not found in generation_config.json (generation_kwargs for "
            "boi_token_id) nor in the tokenizer"
        )
    return int(bos), int(boi), int(pad)


class _JanusSession(CachedSession):
    """KV-cached session over left-padded prompts; cond rows first, then (guided) uncond rows."""

    def __init__(self, model: JanusImageModel, prompts: list[list[int]], guided: bool):
        self.model, self.batch_size, self.guided = model, len(prompts), guided
        rows = prompts + [model.uncond_ids(p) for p in prompts] if guided else prompts
        self.input_ids, self.prompt_mask = left_pad(rows, model.pad_token_id, model.device)  # [R, P]
        self.prompt_lengths = self.prompt_mask.sum(-1)  # [R] real tokens: position of image token 0
        self.padded = not bool(self.prompt_mask.all())
        self.cache = DynamicCache(config=model.config.text_config)
        self._length = -1  # image positions cached; -1 before prefill

    def _attention_mask(self, new: int) -> torch.Tensor | None:
        """``[R, P + cached + new]`` mask; None without padding (plain causal attention)."""
        if not self.padded:
            return None
        ones = self.prompt_mask.new_ones(self.prompt_mask.shape[0], max(self._length, 0) + new)
        return torch.cat([self.prompt_mask, ones], dim=1)

    def _run(self, embeds: torch.Tensor, positions: torch.Tensor, new: int) -> WindowLogits:
        """Language model on ``[R, T, D]`` embeddings, generation head on all T hidden states."""
        with torch.no_grad():
            out = self.model.model.model.language_model(
                inputs_embeds=embeds, attention_mask=self._attention_mask(new), position_ids=positions,
                cache=self.cache, use_cache=True,
            )
            logits = self.model.model.model.generation_head(out.last_hidden_state).float()
        return self._window_logits(logits)

    def prefill(self) -> WindowLogits:
        embeds = self.model.model.get_input_embeddings()(self.input_ids)
        positions = (self.prompt_mask.cumsum(-1) - 1).clamp(min=0)
        logits = self._run(embeds, positions, 0)
        self._length = 0
        return WindowLogits(logits.cond[:, -1:], None if logits.uncond is None else logits.uncond[:, -1:])

    def forward(self, tokens, start):
        self._check_start(start)
        ids = torch.cat([tokens, tokens]) if self.guided else tokens
        with torch.no_grad():
            embeds = self.model.model.prepare_embeddings_for_image_generation(ids.to(self.model.device))
        width = tokens.shape[1]
        positions = self.prompt_lengths[:, None] + start + torch.arange(width, device=self.model.device)
        logits = self._run(embeds, positions, width)
        self._length += width
        return logits
