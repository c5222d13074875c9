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

The prefill sends only each row's last hidden state through the generation head (as
deepseek-ai/Janus ``generation_inference.py`` does: ``gen_head(hidden_states[:, -1, :])``).
Special tokens (BOS, begin-of-image, pad) are resolved by NAME from the tokenizer
(``bos_token``, ``boi_token``, and the pad token ``<｜▁pad▁｜>`` as deepseek-ai/Janus's
``VLChatProcessor.pad_id`` names it, checked against ``generation_config.pad_token_id``);
without a tokenizer, from generation_config.json (:func:`special_ids`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

import torch
from transformers import DynamicCache, JanusConfig, JanusForConditionalGeneration

from ._transformers import (
    cache_kwargs,
    MemoryEstimate, PaddedRows, check_checkpoint, check_sequence_length, check_token_ids, estimate_memory,
    TOKENIZER_FILES, format_prompt, load_tokenizer, meta_parameter_count, parameter_count, resolve_dtype, token_id,
)
from ._conditions import check_conditions
from ._ragged import RaggedSession
from .base import ImageTokenModel
from .defaults import FAMILY_DEFAULTS
from .quantize import load_pretrained

__all__ = ["JanusImageModel", "JanusPrompts", "special_ids", "PAD_TOKEN", "janus_memory", "janus_memory_estimate", "estimate_memory_from_pretrained", "image_size_of",
           "check_image_size"]

#: prompt length assumed by memory estimates when the prompts are not known
DEFAULT_PROMPT_LENGTH = 128


def _grid_side(config: JanusConfig) -> int:
    """sqrt(num_image_tokens), checked against the VQ decoder's latent grid."""
    n = config.vision_config.num_image_tokens
    side = math.isqrt(n)
    if side * side != n or side != config.vq_config.num_patches:
        raise ValueError(
            f"vision_config.num_image_tokens={n} must be a square equal to vq_config.num_patches**2 = {config.vq_config.num_patches ** 2}"
        )
    return side


def image_size_of(config: JanusConfig) -> int:
    """The only output resolution in pixels: ``grid side * 2 ** (len(vq channel_multiplier) - 1)`` (384 for Janus-Pro)."""
    return _grid_side(config) * 2 ** (len(config.vq_config.channel_multiplier) - 1)


def check_image_size(config: JanusConfig, image_size: int | None) -> None:
    """Raise ValueError unless ``image_size`` is None or the checkpoint's resolution (config only: before loading)."""
    size = image_size_of(config)
    if image_size is not None and image_size != size:
        side = _grid_side(config)
        raise ValueError(f"image_size={image_size}: this Janus checkpoint makes {size} x {size} images only "
                         f"({side} x {side} tokens); allowed: {size}")


def janus_memory(config: JanusConfig, num_parameters: int, window: int, dtype: torch.dtype | str,
                 prompt_length: int = DEFAULT_PROMPT_LENGTH, guided: bool = True) -> MemoryEstimate:
    """Memory of a run (:func:`~csdgen.models._transformers.estimate_memory`): sequence = ``prompt_length + N``."""
    size = torch.empty((), dtype=resolve_dtype(dtype)).element_size()
    return estimate_memory(num_parameters, size, config.text_config, prompt_length + config.vision_config.num_image_tokens,
                           config.vq_config.num_embeddings, window, guided,
                           image_tokens=config.vision_config.num_image_tokens)


def janus_memory_estimate(
    config: JanusConfig, num_parameters: int, batch_size: int, window: int, dtype: torch.dtype | str,
    prompt_length: int = DEFAULT_PROMPT_LENGTH, guided: bool = True,
) -> int:
    """Bytes for ``batch_size`` images: :func:`janus_memory` ``.bytes(batch_size)``."""
    return janus_memory(config, num_parameters, window, dtype, prompt_length, guided).bytes(batch_size)


def estimate_memory_from_pretrained(path: str | os.PathLike, batch_size: int, window: int, dtype: torch.dtype | str, **kwargs) -> int:
    """:func:`janus_memory_estimate` from a checkpoint's config.json only (weights not read).

    Parameters are counted on the ``meta`` device. Extra keyword arguments go to
    :func:`janus_memory` (``prompt_length``, ``guided``).
    """
    config = JanusConfig.from_pretrained(check_checkpoint(path, "Janus"))
    count = meta_parameter_count(JanusForConditionalGeneration, config)
    return janus_memory(config, count, window, dtype, **kwargs).bytes(batch_size)


class JanusPrompts:
    """Janus prompt rows from the config and the processor only (usable before the weights are loaded).

    Args:
        config: the checkpoint's ``JanusConfig``; bos_token_id, boi_token_id, pad_token_id: see
            :func:`special_ids`; processor, use_chat_template, prompt_template: see :class:`JanusImageModel`.
    """

    def __init__(self, config: JanusConfig, bos_token_id: int, boi_token_id: int, pad_token_id: int, processor: Any = None,
                 use_chat_template: bool = True, prompt_template: str = "{prompt}"):
        self.config = config
        self.image_size = image_size_of(config)
        self.num_image_tokens = config.vision_config.num_image_tokens
        self.bos_token_id, self.boi_token_id, self.pad_token_id = bos_token_id, boi_token_id, pad_token_id
        self.processor, self.use_chat_template = processor, use_chat_template
        self.prompt_template = prompt_template
        format_prompt(prompt_template, "", 1, 1)  # refuse a bad template now

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, **kwargs) -> "JanusPrompts":
        """From a checkpoint folder's config, generation config and processor (no weights read)."""
        processor = _load_processor(Path(folder))
        return cls(JanusConfig.from_pretrained(folder), *special_ids(folder, processor), processor=processor, **kwargs)

    def encode_conditions(self, conditions: Sequence[str | Sequence[int]]) -> list[list[int]]:
        """Prompt strings or token-id lists -> full prompt ids ending with begin-of-image.

        A string goes through :attr:`prompt_template`, is chat-formatted (when the processor has
        a chat template and ``use_chat_template``) and tokenised by ``JanusProcessor(..., generation_mode="image")``,
        which adds BOS and appends the begin-of-image token. A list of ids is taken as it is,
        with the begin-of-image token appended when it does not end with it.

        Raises:
            ValueError: empty conditions, strings without a processor, ids outside the vocabulary.
        """
        if isinstance(conditions, (str, torch.Tensor)) or conditions is None or len(conditions) == 0:
            raise ValueError(f"conditions={conditions!r}: give a non-empty list of prompt strings or token-id lists")
        check_conditions(conditions)
        return [self._encode_text(c) if isinstance(c, str) else self._check_ids(c) for c in conditions]

    def _encode_text(self, prompt: str) -> list[int]:
        if self.processor is None:
            raise ValueError(f"prompt {prompt!r} is a string but the checkpoint has no processor/tokenizer; give token-id lists")
        text = format_prompt(self.prompt_template, prompt, self.image_size, self.image_size)
        if self.use_chat_template and getattr(self.processor, "chat_template", None):
            messages = [{"role": "user", "content": [{"type": "text", "text": text}]}]
            text = self.processor.apply_chat_template(messages, add_generation_prompt=True)
        ids = self.processor(text=[text], generation_mode="image", return_tensors="pt")["input_ids"][0]
        return ids.tolist()

    def _check_ids(self, ids: Sequence[int]) -> list[int]:
        ids = check_token_ids(ids, self.config.text_config.vocab_size)
        return ids if ids[-1] == self.boi_token_id else ids + [self.boi_token_id]

    def uncond_ids(self, ids: list[int]) -> list[int]:
        """The unconditional row of ``generate``: all but BOS and begin-of-image become pad."""
        keep = (self.bos_token_id, self.boi_token_id)
        return [i if i in keep else self.pad_token_id for i in ids]

    def prompt_rows(self, conditions: Sequence[str | Sequence[int]]) -> tuple[list[list[int]], list[list[int]]]:
        """``(cond rows, uncond rows)``: the ids each row of a guided run reads before image token 0."""
        cond = self.encode_conditions(conditions)
        return cond, [self.uncond_ids(p) for p in cond]

    def check_length(self, prompt_length: int) -> None:
        """Refuse a prompt of ``prompt_length`` tokens too long for ``max_position_embeddings`` with the image.

        Raises:
            ValueError: naming both lengths and the longest prompt allowed.
        """
        check_sequence_length(prompt_length, self.num_image_tokens, self.config.text_config.max_position_embeddings)

    def prompt_length(self, conditions: Sequence[str | Sequence[int]]) -> int:
        """Tokens of the longest prompt row (BOS to begin-of-image; the uncond rows have the same length)."""
        return max(len(r) for r in self.encode_conditions(conditions))


class JanusImageModel(JanusPrompts, ImageTokenModel):
    """Text-to-image Janus / Janus-Pro over a transformers ``JanusForConditionalGeneration``.

    Args:
        model: the loaded model (eval mode is set here).
        bos_token_id, boi_token_id, pad_token_id: BOS, begin-of-image and pad ids of the text
            vocabulary (``generation_config.bos_token_id``,
            ``generation_config.generation_kwargs["boi_token_id"]``, ``pad_token_id``).
        processor: a ``JanusProcessor`` to tokenise prompt strings, or None (token ids only).
        use_chat_template: format strings with the processor's chat template (as the
            transformers Janus example does) before the begin-of-image token is appended.
        prompt_template: format string with ``{prompt}``, ``{width}``, ``{height}`` applied to
            prompt strings before the chat template; default ``"{prompt}"``.

    Attributes:
        image_size: the only output resolution in pixels (``grid side * 2**(levels - 1)``).
        defaults: the family's :class:`~csdgen.models.defaults.FamilyDefaults`.
    """

    def __init__(
        self, model: JanusForConditionalGeneration, bos_token_id: int, boi_token_id: int, pad_token_id: int,
        processor: Any = None, use_chat_template: bool = True, prompt_template: str = "{prompt}",
    ):
        JanusPrompts.__init__(self, model.config, bos_token_id, boi_token_id, pad_token_id, processor, use_chat_template,
                              prompt_template)
        self.model = model.eval()
        self.defaults = FAMILY_DEFAULTS["janus"]
        side = _grid_side(self.config)
        self.grid = (side, side)
        self.codebook_size = self.config.vq_config.num_embeddings
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, dtype: torch.dtype | str = torch.float32, device: str | torch.device = "cpu",
        image_size: int | None = None, use_chat_template: bool = True, prompt_template: str = "{prompt}",
    ) -> "JanusImageModel":
        """Load a transformers-format Janus checkpoint from a local folder (no downloads).

        The processor (tokenizer) is loaded when the folder has one; without it only token-id
        conditions are accepted.

        Args:
            path: folder with config.json, weights, generation_config.json (and processor files).
            dtype: ``torch.float32`` / ``bfloat16`` / ``float16`` or their names.
            device: where the model goes.
            image_size: optional requested resolution in pixels, checked against the checkpoint's
                before the weights are read.
            prompt_template: see :class:`JanusImageModel`.

        Raises:
            FileNotFoundError: no such folder, or no config / weights in it.
            ValueError: bad dtype, unsupported ``image_size``, or special token ids not found
                (all before the weights are read).
        """
        folder = check_checkpoint(path, "Janus")
        dtype = resolve_dtype(dtype)
        check_image_size(JanusConfig.from_pretrained(folder), image_size)
        processor = _load_processor(folder)
        ids = special_ids(folder, processor)
        model = load_pretrained(JanusForConditionalGeneration, folder, dtype=dtype, device=device)
        return cls(model, *ids, processor=processor, use_chat_template=use_chat_template, prompt_template=prompt_template)

    def check_image_size(self, image_size: int | None) -> None:
        """Raise ValueError unless ``image_size`` is None or the checkpoint's resolution."""
        check_image_size(self.config, image_size)

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
        self.check_length(max(len(p) for p in prompts))
        return _JanusSession(self, prompts, guided)

    def memory(self, window: int, guided: bool = True, prompt_length: int = DEFAULT_PROMPT_LENGTH) -> MemoryEstimate:
        """:func:`janus_memory` of this model (its dtype and parameter count)."""
        return janus_memory(self.config, parameter_count(self.model), window, self.dtype, prompt_length, guided)

    def memory_estimate(self, batch_size: int, window: int, dtype: torch.dtype | str | None = None,
                        prompt_length: int = DEFAULT_PROMPT_LENGTH, guided: bool = True) -> int:
        """Bytes: see :func:`janus_memory` (dtype defaults to the model's)."""
        return janus_memory(self.config, parameter_count(self.model), window, dtype or self.dtype, prompt_length,
                            guided).bytes(batch_size)

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


#: the files JanusProcessor.from_pretrained reads its image processor from (one of them)
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def _load_processor(folder: Path):
    """The folder's JanusProcessor, or None when it has no tokenizer files.

    Raises:
        FileNotFoundError: tokenizer files without the processor's config (a partial copy), in one line naming the
            folder (transformers' own error points to the Hub and to one of the two file names).
    """
    from transformers import JanusProcessor

    folder = Path(folder)
    if any((folder / name).is_file() for name in TOKENIZER_FILES) and \
            not any((folder / name).is_file() for name in PROCESSOR_FILES):
        raise FileNotFoundError(f"{str(folder)!r} has a tokenizer but no processor config ({' or '.join(PROCESSOR_FILES)}): "
                                f"Janus builds its prompts with its JanusProcessor; copy that file from the checkpoint")
    return load_tokenizer(folder, JanusProcessor)


#: the pad token Janus pads the unconditional rows with (deepseek-ai/Janus ``VLChatProcessor.pad_tag``;
#: transformers' converter writes its id as ``generation_config.pad_token_id``)
PAD_TOKEN = "<\uff5c\u2581pad\u2581\uff5c>"


def special_ids(folder: str | os.PathLike | None, processor: Any = None, generation_config: Any = None) -> tuple[int, int, int]:
    """``(bos, boi, pad)`` ids, from the tokenizer by name and generation_config.json. Reads no weights.

    BOS and begin-of-image: the tokenizer's ``bos_token`` / ``boi_token`` by name, else
    generation_config's ``bos_token_id`` / ``generation_kwargs["boi_token_id"]`` (what
    transformers' ``generate`` reads; or ``boi_token_id``, where the converter sets it). Pad: the id of
    :data:`PAD_TOKEN` (what deepseek-ai/Janus pads the unconditional rows with,
    ``VLChatProcessor.pad_id``), checked against ``generation_config.pad_token_id`` where both
    exist (transformers' ``convert_janus_weights_to_hf.py`` writes that token's id there); else
    generation_config's, else the tokenizer's ``pad_token``.

    Args:
        folder: the checkpoint folder (its generation_config.json), or None with ``generation_config``.
        generation_config: a loaded ``GenerationConfig`` (an in-memory model's) instead of the folder's file.

    Raises:
        ValueError: an id found nowhere, or the pad token's id and generation_config's
            ``pad_token_id`` disagreeing (one line naming both).
    """
    from transformers import GenerationConfig

    tok = getattr(processor, "tokenizer", None)
    where = "the in-memory model" if folder is None else repr(str(folder))
    gen = generation_config
    if gen is None and folder is not None:
        try:
            gen = GenerationConfig.from_pretrained(folder)
        except OSError:
            gen = None
    found = {}
    for key, attr, gen_value in (
        ("bos_token_id", "bos_token", getattr(gen, "bos_token_id", None)),
        ("boi_token_id", "boi_token", (getattr(gen, "generation_kwargs", None) or {}).get("boi_token_id",
                                                                                     getattr(gen, "boi_token_id", None))),
    ):
        name = getattr(tok, attr, None) if tok is not None else None
        found[key] = token_id(name, None, tok, f"Janus {attr}") if name else gen_value
    gen_pad = getattr(gen, "pad_token_id", None)
    named_pad = tok.get_vocab().get(PAD_TOKEN) if tok is not None else None
    if named_pad is not None and gen_pad is not None and int(named_pad) != int(gen_pad):
        raise ValueError(f"{where}: the Janus pad token {PAD_TOKEN!r} is id {named_pad} in the tokenizer but "
                         f"generation_config's pad_token_id is {gen_pad}; allowed: equal ids (the converter writes that "
                         f"token's id there)")
    tok_pad = getattr(tok, "pad_token", None) if tok is not None else None
    found["pad_token_id"] = (named_pad if named_pad is not None else gen_pad if gen_pad is not None else
                             token_id(tok_pad, None, tok, "Janus pad_token") if tok_pad else None)
    missing = [k for k, v in found.items() if v is None]
    if missing:
        raise ValueError(
            f"{where}: {', '.join(missing)} not found in the tokenizer (by name) nor in generation_config "
            "(generation_kwargs for boi_token_id)"
        )
    return int(found["bos_token_id"]), int(found["boi_token_id"]), int(found["pad_token_id"])


class _JanusSession(RaggedSession):
    """Per-row KV-cached session over left-padded prompts; cond rows first, then (guided) uncond rows."""

    def __init__(self, model: JanusImageModel, prompts: list[list[int]], guided: bool):
        self.model = model
        rows = prompts + [model.uncond_ids(p) for p in prompts] if guided else prompts
        self.rows = PaddedRows(rows, model.pad_token_id, model.device)
        self.input_ids, self.prompt_mask = self.rows.ids, self.rows.mask  # [R, P]
        super().__init__(batch_size=len(prompts), guided=guided, cache=DynamicCache(config=model.config.text_config),
                         prompt_ids=self.rows.ids, prompt_valid=self.rows.mask, num_image_tokens=model.num_image_tokens,
                         device=model.device)

    def _logits(self, ids, attention_mask, position_ids, out, prefill):
        """Language model on the prompt's text embeddings or the image tokens' generation embeddings; generation head at ``out``."""
        with torch.no_grad():
            if prefill:
                embeds = self.model.model.get_input_embeddings()(ids)
            else:
                embeds = self.model.model.prepare_embeddings_for_image_generation(ids)
            hidden = self.model.model.model.language_model(
                inputs_embeds=embeds, attention_mask=attention_mask, position_ids=position_ids, **cache_kwargs(self.kv.cache), use_cache=True,
            ).last_hidden_state
            hidden = hidden.gather(1, out[..., None].expand(-1, -1, hidden.shape[-1]))
            return self.model.model.model.generation_head(hidden).float()
