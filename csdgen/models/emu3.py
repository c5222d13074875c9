"""Emu3 (transformers ``Emu3ForConditionalGeneration``) as an image-token model.

Sequence layout of Emu3 image generation (transformers 5.24: ``Emu3Processor(...,
return_for_image_generation=True)`` builds the prompt, the ``prefix_allowed_tokens_fn`` of the
transformers Emu3 docs constrains the rest; BAAI's original ``processor(mode='G')`` is the same):

* prompt: ``BOS prompt <|image start|> "{rows}*{cols}" <|image token|>`` (the resolution is
  plain text, height first, in VQ tokens; BOS is ``<|extra_203|>``);
* image: ``rows`` rows of ``cols`` visual tokens ``<|visual tokenNNNNNN|>`` (codebook entry
  ``NNNNNN``), each row followed by the end-of-line token ``<|extra_200|>``;
* then end-of-frame ``<|extra_201|>``, end-of-image ``<|image end|>``, EOS ``<|extra_204|>``.

The engine sees only the ``N = rows * cols`` visual tokens. :meth:`_Emu3Session.forward`
inserts the end-of-line token after every row end inside its window (forced: the model's
output at a row's last visual token is not returned; the end-of-line token's output predicts the
next row's first token), and keeps the map image length ``k`` -> cached sequence length
``P + k + k // cols`` for rollback.

Prompt text is pre-tokenized as BAAI's Emu3 tokenizer does (the one Emu3 was trained with,
baaivision/Emu3 ``emu3/mllm/tokenization_emu3.py``: tiktoken with Qwen's regex ``PAT_STR`` after
NFC normalisation), not as transformers' converted tokenizer.json does (``ByteLevel`` with the
GPT-2 regex, ``convert_emu3_weights_to_hf.py``): the two split a hyphen, comma or quote before
a letter, and digit runs, differently ("-up" is one piece under Qwen's rule, "-", "up" under
GPT-2's; "90" two pieces under Qwen's). :func:`baai_tokenizer` sets that split on a copy of the
loaded tokenizer.

Prompt strings get Emu3's positive prompt appended, as BAAI's Emu3-Gen example does
(``prompt = [p + POSITIVE_PROMPT for p in prompt]``, :data:`POSITIVE_PROMPT`); pass
``positive_prompt=""`` (CLI ``--no-positive-prompt``) to turn it off. An optional template
(``{prompt}``, ``{width}``, ``{height}``) is applied first.

Classifier-free guidance: the unconditional row is the negative prompt in the same layout (as
BAAI's Emu3-Gen example builds it, ``processor(NEGATIVE_PROMPT, mode='G')``, without the
positive prompt; the transformers doc example feeds the bare negative prompt instead). Cond rows, then uncond rows, in one forward;
prompts of different lengths are left-padded with an attention mask, and position ids count
the real tokens only (as ``generate`` does from the attention mask).
"""

from __future__ import annotations

import copy
import json
import math
import os
from typing import Any, Sequence

import torch
from transformers import DynamicCache, Emu3Config, Emu3ForConditionalGeneration

from ._transformers import (
    cache_kwargs,
    MemoryEstimate, PaddedRows, check_checkpoint, check_sequence_length, check_token_ids,
    estimate_memory, format_prompt, load_tokenizer, meta_parameter_count, parameter_count, resolve_dtype, token_id,
)
from ._conditions import check_conditions
from ._ragged import RaggedSession
from .base import ImageTokenModel
from .defaults import FAMILY_DEFAULTS
from .quantize import load_pretrained

__all__ = [
    "Emu3ImageModel",
    "Emu3Prompts",
    "DEFAULT_NEGATIVE_PROMPT",
    "POSITIVE_PROMPT",
    "emu3_memory_estimate",
    "estimate_memory_from_pretrained",
    "image_grid",
    "QWEN_PATTERN",
    "baai_tokenizer",
]

#: Emu3's documented negative prompt (BAAI Emu3-Gen model card, transformers Emu3 docs)
DEFAULT_NEGATIVE_PROMPT = (
    "lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, cropped, "
    "worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, username, blurry."
)
#: appended to every prompt string by BAAI's Emu3-Gen example (baaivision/Emu3 README, ``POSITIVE_PROMPT``)
POSITIVE_PROMPT = " masterpiece, film grained, best quality."
#: default image area in pixels (``Emu3Processor.image_area``): 720 x 720 at 1:1
DEFAULT_IMAGE_AREA = 518400
#: prompt length assumed by memory estimates when the prompts are not known
DEFAULT_PROMPT_LENGTH = 128

#: BAAI's Emu3 tokenizer's pre-tokenization regex (``PAT_STR`` of baaivision/Emu3
#: ``emu3/mllm/tokenization_emu3.py``, Qwen's: one digit per piece, punctuation joins the letters after it)
QWEN_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def _is_qwen_split(pre: dict) -> bool:
    splits = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    return any(p.get("type") == "Split" and (p.get("pattern") or {}).get("Regex") == QWEN_PATTERN for p in splits)


def baai_tokenizer(tokenizer: Any) -> Any:
    """The tokenizer pre-tokenizing as BAAI's Emu3 tokenizer: a copy with NFC normalisation, the
    :data:`QWEN_PATTERN` split (isolated pieces) and a byte-level step without its own regex.

    Applied to a byte-level tokenizer that splits with the GPT-2 regex (transformers' converted
    ``tokenizer.json``); a tokenizer already splitting with :data:`QWEN_PATTERN`, one without a
    ``tokenizers`` backend, or of another kind is returned as it is. The given object is not modified.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return tokenizer
    state = json.loads(backend.to_str())
    pre = state.get("pre_tokenizer") or {}
    if _is_qwen_split(pre) or not (pre.get("type") == "ByteLevel" and pre.get("use_regex", True)):
        return tokenizer
    from tokenizers import Regex, normalizers, pre_tokenizers

    out = copy.deepcopy(tokenizer)
    out.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    if state.get("normalizer") is None:
        out.backend_tokenizer.normalizer = normalizers.NFC()
    return out


# (tokenizer attribute, Emu3 token name): the names of the Emu3-*-hf tokenizers
_SPECIAL = {
    "bos": ("bos_token", "<|extra_203|>"),
    "eos": ("eos_token", "<|extra_204|>"),
    "pad": ("pad_token", "<|endoftext|>"),
    "boi": ("boi_token", "<|image start|>"),
    "wrapper": ("image_wrapper_token", "<|image token|>"),
    "eol": (None, "<|extra_200|>"),  # Emu3ImageVocabularyMapping.eol_token_id
    "eof": ("eof_token", "<|extra_201|>"),
    "eoi": ("eoi_token", "<|image end|>"),
}


def _spatial_factor(config: Emu3Config) -> int:
    """Pixels per VQ token along each side: ``2 ** (len(channel_multiplier) - 1)`` (Emu3VQVAE)."""
    return 2 ** (len(config.vq_config.channel_multiplier) - 1)


def _largest_square(max_positions: int, reserve: int) -> int:
    """Largest side s (tokens) with ``s * (s + 1) + reserve <= max_positions``."""
    s = math.isqrt(max(max_positions - reserve, 0))
    while s > 0 and s * (s + 1) + reserve > max_positions:
        s -= 1
    return s


def image_grid(config: Emu3Config, height: int | None = None, width: int | None = None) -> tuple[int, int]:
    """Requested size in pixels -> ``(rows, cols)`` in VQ tokens.

    Default (None): Emu3's default area (``Emu3Processor.image_area`` = 518400 px, 1:1). A side
    must be a positive multiple of the VQ's spatial factor, and the image sequence
    ``rows * (cols + 1)`` (visual and end-of-line tokens) plus a minimal prompt must fit in
    ``text_config.max_position_embeddings``.

    Raises:
        ValueError: naming the size and what is allowed.
    """
    factor = _spatial_factor(config)
    side = round(math.sqrt(DEFAULT_IMAGE_AREA) / factor) * factor
    sizes = {"height": side if height is None else height, "width": side if width is None else width}
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < factor or value % factor:
            raise ValueError(f"{name}={value!r} px: allowed positive multiples of {factor} px (the VQ's spatial factor)")
    rows, cols = sizes["height"] // factor, sizes["width"] // factor
    limit = config.text_config.max_position_embeddings
    reserve = 8  # BOS, begin-of-image, "r*c", image token, the 3 end tokens: the least an image needs
    if rows * (cols + 1) + reserve > limit:
        s = _largest_square(limit, reserve) * factor
        raise ValueError(
            f"{sizes['height']} x {sizes['width']} px = {rows} x {cols} tokens needs {rows * (cols + 1) + reserve} positions "
            f"> max_position_embeddings={limit}; allowed: rows * (cols + 1) + prompt <= {limit} (e.g. up to {s} x {s} px)"
        )
    return rows, cols


def emu3_memory_estimate(
    config: Emu3Config, num_parameters: int, batch_size: int, window: int, dtype: torch.dtype | str,
    grid: tuple[int, int], prompt_length: int = DEFAULT_PROMPT_LENGTH, guided: bool = True,
) -> int:
    """Bytes for ``batch_size`` images: :func:`emu3_memory` ``.bytes(batch_size)``."""
    return emu3_memory(config, num_parameters, window, dtype, grid, prompt_length, guided).bytes(batch_size)


def emu3_memory(config: Emu3Config, num_parameters: int, window: int, dtype: torch.dtype | str, grid: tuple[int, int],
                prompt_length: int = DEFAULT_PROMPT_LENGTH, guided: bool = True) -> MemoryEstimate:
    """Memory of a run (:func:`~csdgen.models._transformers.estimate_memory`): sequence =
    ``prompt_length + rows * (cols + 1) + 3`` (visual tokens, end-of-line per row, the end tokens)."""
    size = torch.empty((), dtype=resolve_dtype(dtype)).element_size()
    seq = prompt_length + grid[0] * (grid[1] + 1) + 3
    return estimate_memory(num_parameters, size, config.text_config, seq, config.vq_config.codebook_size, window, guided,
                           image_tokens=grid[0] * grid[1])


def estimate_memory_from_pretrained(
    path: str | os.PathLike, batch_size: int, window: int, dtype: torch.dtype | str,
    height: int | None = None, width: int | None = None, **kwargs,
) -> int:
    """:func:`emu3_memory_estimate` from a checkpoint's config.json only (weights not read).

    Parameters are counted on the ``meta`` device; ``height``/``width`` in pixels as in
    :func:`image_grid`. Extra keyword arguments (``prompt_length``, ``guided``) go to
    :func:`emu3_memory`.
    """
    config = Emu3Config.from_pretrained(check_checkpoint(path, "Emu3"))
    grid = image_grid(config, height, width)
    count = meta_parameter_count(Emu3ForConditionalGeneration, config)
    return emu3_memory(config, count, window, dtype, grid, **kwargs).bytes(batch_size)


class Emu3Prompts:
    """Emu3 prompt rows from the config and the tokenizer only (usable before the weights are loaded).

    Args: see :class:`Emu3ImageModel` (``config`` instead of the model).
    """

    def __init__(self, config: Emu3Config, tokenizer: Any = None, height: int | None = None, width: int | None = None,
                 negative_prompt: str | Sequence[int] = DEFAULT_NEGATIVE_PROMPT, positive_prompt: str = POSITIVE_PROMPT,
                 prompt_template: str = "{prompt}"):
        self.config = config
        self.tokenizer = baai_tokenizer(tokenizer)
        self.grid = image_grid(config, height, width)
        self.num_image_tokens = self.grid[0] * self.grid[1]
        factor = _spatial_factor(config)
        self.image_size = (self.grid[0] * factor, self.grid[1] * factor)
        self.special = _special_ids(config.vocabulary_map or {}, self.tokenizer)
        names = {i: n for n, i in (config.vocabulary_map or {}).items() if i in self.special.values()}
        self._names = {k: names[i] for k, i in self.special.items()}
        self.negative_prompt = negative_prompt
        self.positive_prompt = positive_prompt
        self.prompt_template = prompt_template
        format_prompt(prompt_template, "", 1, 1)  # refuse a bad template now

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, **kwargs) -> "Emu3Prompts":
        """From a checkpoint folder's config and tokenizer (no weights read)."""
        return cls(Emu3Config.from_pretrained(folder), load_tokenizer(folder), **kwargs)

    # -- prompts -------------------------------------------------------------------------

    def image_prefix_text(self) -> str:
        """``<|image start|>{rows}*{cols}<|image token|>``: what ``Emu3Processor`` appends to a prompt."""
        return f"{self._names['boi']}{self.grid[0]}*{self.grid[1]}{self._names['wrapper']}"

    def prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        """One condition -> the full prompt ids, ``BOS ... <|image token|>``.

        A string is tokenised as ``Emu3Processor(text, return_for_image_generation=True)`` does:
        ``BOS + prompt + image prefix`` in one call of the tokenizer (the template and the
        positive prompt applied to the conditions first, see :meth:`condition_ids`). A list of ids is the prompt
        body: BOS is prepended (unless it is already first) and the image prefix appended.

        Raises:
            ValueError: a string without a tokenizer, ids outside the vocabulary.
        """
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"prompt {prompt!r} is a string but the checkpoint has no tokenizer; give token-id lists")
            text = f"{self.tokenizer.bos_token}{prompt}{self.image_prefix_text()}"
            return list(self.tokenizer(text)["input_ids"])
        ids = check_token_ids(prompt, self.config.text_config.vocab_size)
        bos = self.special["bos"]
        body = ids if ids and ids[0] == bos else [bos] + ids
        return body + self._prefix_ids()

    def condition_ids(self, condition: str | Sequence[int]) -> list[int]:
        """A condition's prompt ids: strings through the template, then + :attr:`positive_prompt`."""
        if isinstance(condition, str):
            h, w = self.image_size
            condition = format_prompt(self.prompt_template, condition, w, h) + self.positive_prompt
        return self.prompt_ids(condition)

    def prompt_rows(self, conditions: Sequence[str | Sequence[int]]) -> tuple[list[list[int]], list[list[int]]]:
        """``(cond rows, uncond rows)``: the ids each row of a guided run reads before image token 0."""
        cond = [self.condition_ids(c) for c in check_conditions(conditions)]
        return cond, [self.prompt_ids(self.negative_prompt)] * len(cond)

    @property
    def image_length(self) -> int:
        """Positions of the generated part: ``rows * (cols + 1)`` plus end-of-frame, end-of-image, EOS."""
        return self.grid[0] * (self.grid[1] + 1) + 3

    def _prefix_ids(self) -> list[int]:
        if self.tokenizer is not None:
            return list(self.tokenizer(self.image_prefix_text())["input_ids"])
        vocab = self.config.vocabulary_map
        digits = [vocab.get(c) for c in f"{self.grid[0]}*{self.grid[1]}"]
        if None in digits:
            raise ValueError("the resolution text needs the tokenizer (digits are not single vocabulary entries); add tokenizer files")
        return [self.special["boi"], *digits, self.special["wrapper"]]

    def check_length(self, prompt_length: int) -> None:
        """Refuse a prompt of ``prompt_length`` tokens too long for ``max_position_embeddings`` with the image.

        Raises:
            ValueError: naming both lengths and the longest prompt allowed; where the unconditional row (the
                negative prompt, the same for every image) is what does not fit, naming it and the longest
                negative prompt allowed instead.
        """
        limit = self.config.text_config.max_position_embeddings
        if prompt_length + self.image_length > limit > self.image_length and (
                self.tokenizer is not None or not isinstance(self.negative_prompt, str)):
            negative = len(self.prompt_ids(self.negative_prompt))
            if negative + self.image_length > limit:
                raise ValueError(
                    f"the negative prompt's row of {negative} tokens + image of {self.image_length} positions = "
                    f"{negative + self.image_length} > max_position_embeddings={limit}; allowed: a negative prompt "
                    f"(negative_prompt=, --negative-prompt) whose row takes at most {limit - self.image_length} tokens")
        check_sequence_length(prompt_length, self.image_length, limit)

    def prompt_length(self, conditions: Sequence[str | Sequence[int]]) -> int:
        """Tokens of the longest row (cond or uncond) before the first visual token."""
        cond, uncond = self.prompt_rows(conditions)
        return max(len(r) for r in cond + uncond)


class Emu3ImageModel(Emu3Prompts, ImageTokenModel):
    """Text-to-image Emu3 over a transformers ``Emu3ForConditionalGeneration``.

    Args:
        model: the loaded model (eval mode is set here).
        tokenizer: the checkpoint's tokenizer (strings are tokenised with a copy splitting as
            BAAI's, :func:`baai_tokenizer`), or None (token-id conditions only).
        height, width: image size in pixels (see :func:`image_grid`); default Emu3's 720 x 720.
        negative_prompt: the unconditional row's prompt (string or token ids); default
            :data:`DEFAULT_NEGATIVE_PROMPT`; ``""`` gives an empty negative prompt.
        positive_prompt: appended to every prompt string (not to token ids, not to the negative
            prompt); default :data:`POSITIVE_PROMPT`; ``""`` turns it off.
        prompt_template: format string with ``{prompt}``, ``{width}``, ``{height}`` applied to
            prompt strings before the positive prompt; default ``"{prompt}"``.

    Attributes:
        image_size: ``(height, width)`` in pixels of :meth:`decode_images`' output.
        visual_ids: ``[V]`` int64, text-vocabulary id of codebook entry ``v``
            (``model.vocabulary_mapping.img2bpe``).
        special: ids of the layout's special tokens (bos, eos, pad, boi, wrapper, eol, eof, eoi).
        defaults: the family's :class:`~csdgen.models.defaults.FamilyDefaults`.

    Raises:
        ValueError: bad size, visual tokens not numbered ``0 .. V - 1`` with V = the VQ codebook
            size, or a special token missing from the vocabulary.
    """

    def __init__(
        self, model: Emu3ForConditionalGeneration, tokenizer: Any = None, height: int | None = None,
        width: int | None = None, negative_prompt: str | Sequence[int] = DEFAULT_NEGATIVE_PROMPT,
        positive_prompt: str = POSITIVE_PROMPT, prompt_template: str = "{prompt}",
    ):
        Emu3Prompts.__init__(self, model.config, tokenizer, height, width, negative_prompt, positive_prompt, prompt_template)
        self.model = model.eval()
        self.defaults = FAMILY_DEFAULTS["emu3"]
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.visual_ids = _visual_ids(model, self.config.vq_config.codebook_size).to(self.device)
        self.codebook_size = int(self.visual_ids.numel())
        self._head = _visual_head(model.lm_head.weight, self.visual_ids)

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, dtype: torch.dtype | str = torch.float32, device: str | torch.device = "cpu",
        height: int | None = None, width: int | None = None,
        negative_prompt: str | Sequence[int] = DEFAULT_NEGATIVE_PROMPT, positive_prompt: str = POSITIVE_PROMPT,
        prompt_template: str = "{prompt}",
    ) -> "Emu3ImageModel":
        """Load a transformers-format Emu3 checkpoint (e.g. a local copy of ``BAAI/Emu3-Gen-hf``).

        Args:
            path: folder with config.json, weights and (for string prompts) tokenizer files.
            dtype: ``torch.float32`` / ``bfloat16`` / ``float16`` or their names.
            device: where the model goes.
            height, width: image size in pixels (multiples of the VQ's spatial factor, 8 for Emu3).
            negative_prompt, positive_prompt, prompt_template: see :class:`Emu3ImageModel`.

        Raises:
            FileNotFoundError: no such folder, or no config / weights in it.
            ValueError: bad dtype or size (checked before the weights are read), or see :class:`Emu3ImageModel`.
        """
        folder = check_checkpoint(path, "Emu3")
        dtype = resolve_dtype(dtype)
        image_grid(Emu3Config.from_pretrained(folder), height, width)
        model = load_pretrained(Emu3ForConditionalGeneration, folder, dtype=dtype, device=device)
        return cls(model, load_tokenizer(folder), height, width, negative_prompt, positive_prompt, prompt_template)

    def image_sequence(self, tokens: torch.Tensor) -> torch.Tensor:
        """Codebook ids ``[B, N]`` -> the generated part of Emu3's sequence ``[B, rows * (cols + 1) + 3]``.

        Visual token ids row by row, end-of-line after every row, then end-of-frame, end-of-image,
        EOS: what Emu3's ``generate`` with its prefix constraint produces and
        ``decode_image_tokens`` takes.
        """
        rows, cols = self.grid
        B = tokens.shape[0]
        image = self.visual_ids[tokens.to(self.device)].view(B, rows, cols)
        eol = image.new_full((B, rows, 1), self.special["eol"])
        tail = torch.tensor([self.special[k] for k in ("eof", "eoi", "eos")], device=self.device).expand(B, 3)
        return torch.cat([torch.cat([image, eol], dim=2).flatten(1), tail], dim=1)

    # -- the engine's interface ------------------------------------------------------------

    def start(self, conditions, batch_size, guided) -> "_Emu3Session":
        """Open a session; ``conditions`` = prompt strings or token-id lists (see :meth:`prompt_ids`).

        Raises:
            ValueError: no/empty conditions, ``batch_size`` differing from their number, or a
                sequence longer than ``max_position_embeddings``.
        """
        if conditions is None or isinstance(conditions, (str, torch.Tensor)) or len(conditions) == 0:
            raise ValueError(f"conditions={conditions!r}: Emu3ImageModel needs a non-empty list of prompt strings or token-id lists")
        if batch_size is not None and batch_size != len(conditions):
            raise ValueError(f"batch_size={batch_size} differs from the {len(conditions)} conditions given")
        prompts, uncond = self.prompt_rows(conditions)
        rows = prompts + uncond if guided else prompts
        self.check_length(max(len(r) for r in rows))
        return _Emu3Session(self, rows, len(prompts), guided)

    def visual_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[..., D]`` -> logits ``[..., V]`` of the visual tokens, column v = codebook entry v."""
        return torch.nn.functional.linear(hidden, self._head)

    def memory(self, window: int, guided: bool = True, prompt_length: int = DEFAULT_PROMPT_LENGTH) -> MemoryEstimate:
        """:func:`emu3_memory` of this model (its dtype and parameter count)."""
        return emu3_memory(self.config, parameter_count(self.model), window, self.dtype, self.grid, prompt_length, guided)

    def memory_estimate(self, batch_size: int, window: int, dtype: torch.dtype | str | None = None,
                        prompt_length: int = DEFAULT_PROMPT_LENGTH, guided: bool = True) -> int:
        """Bytes: see :func:`emu3_memory` (dtype defaults to the model's)."""
        return emu3_memory(self.config, parameter_count(self.model), window, dtype or self.dtype, self.grid,
                           prompt_length, guided).bytes(batch_size)

    def codebook_embeddings(self) -> torch.Tensor:
        """``[V, D]`` float32 VQ codebook (``vqmodel.quantize.embedding``; Emu3 feeds it unnormalised)."""
        return self.model.model.vqmodel.quantize.embedding.weight.detach().float()

    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens ``[B, N]`` int64 -> ``[B, 3, H, W]`` float32 in [-1, 1], ``(H, W)`` = :attr:`image_size`.

        Goes through Emu3's own path: :meth:`image_sequence` then
        ``decode_image_tokens(image_tokens=, height=rows, width=cols)`` (NCHW, unclamped; clamped here).
        """
        if tokens.ndim != 2 or tokens.shape[1] != self.num_image_tokens:
            raise ValueError(f"tokens of shape {tuple(tokens.shape)}: expected [B, {self.num_image_tokens}]")
        if tokens.numel() and not (0 <= int(tokens.min()) and int(tokens.max()) < self.codebook_size):
            raise ValueError(f"image tokens must lie in 0..{self.codebook_size - 1}")
        with torch.no_grad():
            images = self.model.decode_image_tokens(image_tokens=self.image_sequence(tokens), height=self.grid[0],
                                                    width=self.grid[1])
        return images.float().clamp(-1, 1)


def _special_ids(vocab: dict[str, int], tokenizer) -> dict[str, int]:
    """Ids of the layout's special tokens, by the tokenizer's names (Emu3's names as fallback).

    Raises:
        ValueError: a token missing from the vocabulary, or the tokenizer and the config's
            ``vocabulary_map`` disagreeing on an id.
    """
    ids = {}
    for key, (attr, default) in _SPECIAL.items():
        name = (getattr(tokenizer, attr, None) if tokenizer is not None and attr else None) or default
        if name not in vocab:
            raise ValueError(f"special token {name!r} ({key}) is not in config.vocabulary_map: not an Emu3 vocabulary")
        ids[key] = token_id(name, vocab, tokenizer, f"Emu3 {key} token")
    return ids


def _visual_ids(model: Emu3ForConditionalGeneration, codebook_size: int) -> torch.Tensor:
    """``[V]`` int64 text ids of ``<|visual token000000|>`` ... from ``model.vocabulary_mapping``."""
    img2bpe = model.vocabulary_mapping.img2bpe  # {codebook id: text id}, parsed from the token names
    if sorted(img2bpe) != list(range(codebook_size)):
        raise ValueError(
            f"the vocabulary holds {len(img2bpe)} visual tokens; expected <|visual token000000|> .. "
            f"<|visual token{codebook_size - 1:06d}|> (vq_config.codebook_size={codebook_size})"
        )
    return torch.tensor([img2bpe[v] for v in range(codebook_size)], dtype=torch.long)


def _visual_head(weight: torch.Tensor, visual_ids: torch.Tensor) -> torch.Tensor:
    """Rows of ``lm_head.weight`` for the visual tokens: a view when their ids are contiguous."""
    first = int(visual_ids[0])
    if torch.equal(visual_ids, torch.arange(first, first + visual_ids.numel(), device=visual_ids.device)):
        return weight.detach().narrow(0, first, visual_ids.numel())
    return weight.detach()[visual_ids]


class _Emu3Session(RaggedSession):
    """Per-row KV-cached session over left-padded prompt rows (cond rows first, then uncond rows).

    Image length ``k`` <-> region length ``k + k // cols``: the end-of-line token after an image
    row travels with the row's last image position (:func:`csdgen.models._ragged.window_columns`).
    """

    def __init__(self, model: Emu3ImageModel, rows: list[list[int]], batch_size: int, guided: bool):
        self.model = model
        self.rows = PaddedRows(rows, model.special["pad"], model.device)
        self.input_ids, self.prompt_mask = self.rows.ids, self.rows.mask  # [R, P]
        super().__init__(batch_size=batch_size, guided=guided, cache=DynamicCache(config=model.config.text_config),
                         prompt_ids=self.rows.ids, prompt_valid=self.rows.mask, num_image_tokens=model.num_image_tokens,
                         device=model.device, cols=model.grid[1], row_end=model.special["eol"], filler=model.special["pad"])

    def _vocab_ids(self, tokens):
        return self.model.visual_ids[tokens]

    def _logits(self, ids, attention_mask, position_ids, out, prefill):
        with torch.no_grad():
            hidden = self.model.model.model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids,
                                            **cache_kwargs(self.kv.cache), use_cache=True).last_hidden_state
            hidden = hidden.gather(1, out[..., None].expand(-1, -1, hidden.shape[-1]))
            return self.model.visual_logits(hidden)
