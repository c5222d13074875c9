"""Lumina-mGPT 2.0 (Alpha-VLLM, 2025; arXiv 2507.17801): a Chameleon-architecture decoder over MoVQGAN codes.

Read from Alpha-VLLM/Lumina-mGPT-2.0 (``lumina_mgpt/inference_solver.py``, ``data/item_processor.py``,
``data/convertsation.py``, ``generate_examples/generate.py``, ``xllmx/model/tokenizer.py``,
``model/chameleon/modeling_chameleon.py``); the "Checked against the reference code" table of
docs/models.md lists each point.

Checkpoint: ``model_type`` chameleon, architecture ``ChameleonXLLMXForConditionalGeneration``,
the layers of Lumina-mGPT 1.0 (q/k norms per model-parallel shard, expanded on load by
:func:`csdgen.models.chameleon.load_backbone`), no ``vqmodel`` weights (the fine-tuning deletes
``model.vqmodel``; the module is dropped after loading). What tells it from 1.0: its image
tokens are the vocabulary's ``<MOVQGAN...`` names (:data:`~csdgen.models._transformers.MOVQGAN_PREFIX`),
16384 MoVQGAN codes at one block of ids (155000-171383 in the release; the reference decodes
``id - 155000``): codebook entry ``v`` is the ``v``-th smallest of those ids.

Sequence (``FlexARItemProcessor.process_image``; ``P`` = prompt ids, without BOS)::

    BOS P <racm3:break> <reserved{8800+H/32}> <reserved{8800+W/32}>
        row_0 <reserved08799> row_1 <reserved08799> ... row_{R-1} <reserved08799> <eoss>

with 8-pixel tokens: ``R = H / 8`` rows of ``C = W / 8`` codes (768 px: 96 x 96 codes, 9312
region tokens), the resolution tokens in 32-pixel units (``patch_size`` 32), ``H`` and ``W``
multiples of 32. The reference lets the model sample begin-of-image and the two resolution
tokens; here they are forced (part of the prefill). BOS is the tokenizer's BOS, else its EOS
(``xllmx`` ``Tokenizer``: a Qwen-style tokenizer has no BOS). String prompts are
``"Generate an image of {W}x{H} according to the following prompt:\\n{prompt}"`` followed by
the end-of-turn ``<reserved08706>`` (``generate.py`` and ``Conversation``), tokenised without
special tokens.

Classifier-free guidance (``LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor``):
the unconditional rows run ``input_ids[:, image_start:]``, i.e. begin-of-image, the two
resolution tokens and the image so far, from position 0 (the prompt and BOS hidden by the
attention mask, as for Lumina-mGPT 1.0); the scale follows :class:`Lumina2Guidance`. The
reference's *SJD script* (``generate_examples/jacobi_utils_static.py``, ``--speculative_jacobi``)
defines another target: its unconditional rows also see the prompt's last token (it masks all
prompt tokens but the last, positions from 0), its scale is constant, and it adds top-nσ
(n = 1) after top-k; ``uncond_context="last-prompt-token"`` with
``SamplingConfig(top_n_sigma=1.0)`` and no schedule reproduces that target (the peer benchmark
compares the two SJDs on it). Image-token
masking, forced row ends and end-of-image (``MultiModalLogitsProcessor``) are the image-only
logits and row ends of the session. Defaults (README, ``scripts/sample.sh``): CFG 4.0, top-k
4096, temperature 1.0, 768 x 768.

Images decode with the MoVQGAN 270M decoder (:mod:`csdgen.models.movqgan`,
``movqgan_270M.ckpt``; the checkpoint folder does not ship it).

Not verified on the real checkpoint (no download possible here): the exact spelling after
``<MOVQGAN`` (only the prefix is read), the tokenizer's BOS/EOS, that ``<reserved08706>`` and the
resolution tokens are single tokens of its tokenizer, ``max_position_embeddings`` (a 768 px image
needs 9316 positions after the prompt).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from transformers import ChameleonConfig, ChameleonForConditionalGeneration

from csdgen.guidance import GuidanceSchedule

from ._transformers import (
    MemoryEstimate, check_checkpoint, check_sequence_length, estimate_memory, format_prompt, load_tokenizer,
    movqgan_token_ids, parameter_count, resolve_dtype, token_id,
)
from .base import ImageTokenModel
from .chameleon import (
    BOI, EOI, LUMINA_PROMPT_TEMPLATE, NEWLINE, file_tensor_names, load_backbone, resolution_token_ids,
)
from ._layout_model import DEFAULT_PROMPT_LENGTH, LayoutImageModel, LayoutPrompts
from .defaults import FAMILY_DEFAULTS
from .movqgan import MoVQGANDecoder, find_movqgan, load_movqgan_decoder

__all__ = ["Lumina2Guidance", "Lumina2Layout", "Lumina2Prompts", "Lumina2ImageModel", "lumina2_memory",
           "image_vocabulary", "PIXELS_PER_TOKEN", "GRID_PIXELS"]

#: pixels per image token along a side (MoVQGAN's downsampling; the reference's ``// 8``)
PIXELS_PER_TOKEN = 8
#: pixels per resolution-token unit (``FlexARItemProcessor.patch_size``)
GRID_PIXELS = 32
#: what the unconditional rows may see before the image (:class:`Lumina2Layout`)
UNCOND_CONTEXTS = ("begin-of-image", "last-prompt-token")


@dataclass(frozen=True)
class Lumina2Guidance(GuidanceSchedule):
    """Lumina-mGPT 2.0's guidance schedule, exactly as its CFG processor computes it.

    ``inference_solver.py`` updates the scale at every generation step of the image, before
    using it: ``g = max(4, g * (1 - n / D))``, starting from the given scale, where ``n`` is
    the number of tokens after begin-of-image (the two resolution tokens, the image tokens and
    row ends so far) and ``D = (2 h) (2 w)`` for resolution tokens ``h``, ``w`` (a quarter of
    the image tokens: the processor keeps Lumina-mGPT 1.0's 16-pixel grid). Row-end steps
    update it too (their token is forced). So image position ``i`` (sequence element ``k = i +
    i // C`` after the width token) gets ``g_k = max(floor, s prod_{j <= k} (1 - (2 + j) / D))``
    until that first reaches the floor, and the floor afterwards (the recursion never rises
    again). As in the reference, a scale of 1 means no guidance, and any other scale is raised
    to at least the floor at the first step (``--guidance-scale 3`` guides with 4).

    Attributes:
        floor: the reference's 4.0.
    """

    floor: float = 4.0
    name = "lumina-mgpt-2"

    def scales(self, scale: float, num_image_tokens: int, grid: tuple[int, int]) -> torch.Tensor:
        rows, cols = grid
        if rows * cols != num_image_tokens:
            raise ValueError(f"grid={grid} does not hold {num_image_tokens} image tokens")
        denominator = rows * cols / 4
        steps = rows * (cols + 1)  # sequence elements holding image tokens and row ends
        n = 2 + torch.arange(steps, dtype=torch.float64)
        factor = 1 - n / denominator
        running = torch.cumprod(torch.cat([torch.tensor([float(scale)], dtype=torch.float64), factor]), 0)[1:]
        above = (running > self.floor) & (factor > 0)
        still = torch.cumprod(above.long(), 0).bool()  # before the first step at or below the floor
        g = torch.where(still, running, torch.full_like(running, float(self.floor)))
        i = torch.arange(num_image_tokens)
        return g[i + i // cols]


def image_vocabulary(config: ChameleonConfig) -> torch.Tensor:
    """``[V]`` int64: the vocabulary id of MoVQGAN code ``v`` (the sorted ``<MOVQGAN...`` ids).

    Raises:
        ValueError: no ``<MOVQGAN`` tokens, or their ids are not one block (the reference decodes ``id - first``).
    """
    ids = movqgan_token_ids(config.vocabulary_map)
    if not ids:
        raise ValueError("the checkpoint's vocabulary_map has no <MOVQGAN...> image tokens: not a Lumina-mGPT 2.0 checkpoint")
    if ids != list(range(ids[0], ids[0] + len(ids))):
        raise ValueError(f"the {len(ids)} <MOVQGAN...> ids are not one block {ids[0]}..{ids[0] + len(ids) - 1}: "
                         "the reference decodes a code as id - the first id")
    return torch.tensor(ids, dtype=torch.long)


def _bos_of(tokenizer: Any, vocab: dict[str, int]) -> int:
    """The reference's BOS: the tokenizer's ``bos_token``, else its ``eos_token`` (``xllmx`` ``Tokenizer``)."""
    if tokenizer is None:
        raise ValueError("Lumina-mGPT 2.0 needs the checkpoint's tokenizer (tokenizer.json, tokenizer_config.json): "
                         "its BOS is the tokenizer's BOS or EOS token")
    for name in (getattr(tokenizer, "bos_token", None), getattr(tokenizer, "eos_token", None)):
        if name:
            return token_id(str(name), vocab, tokenizer, "BOS (the tokenizer's BOS, else EOS)")
    raise ValueError("the tokenizer has neither a BOS nor an EOS token; the reference starts every prompt with one")


@dataclass(frozen=True)
class Lumina2Layout:
    """Where the special tokens go (module docstring). ``region`` = image tokens and row ends.

    Attributes:
        rows, cols: the code grid; bos, pad, boi, eoi, newline: ids (pad = the tokenizer's pad,
        else BOS: only masked slots hold it); resolution_tokens: height then width token ids;
        uncond_context: what the unconditional rows see before the image: ``"begin-of-image"``
        (the reference's CFG processor; default) or ``"last-prompt-token"`` (its SJD script).
    """

    rows: int
    cols: int
    bos: int
    pad: int
    boi: int
    eoi: int
    newline: int
    resolution_tokens: tuple[int, int]
    uncond_context: str = "begin-of-image"

    @classmethod
    def build(cls, config: ChameleonConfig, height: int | None, width: int | None, tokenizer: Any,
              uncond_context: str = "begin-of-image") -> "Lumina2Layout":
        """Check the size (default 768 x 768) and resolve the special ids by name.

        Raises:
            ValueError: a size that is not a positive multiple of 32 pixels, special tokens missing,
                no tokenizer.
        """
        if uncond_context not in UNCOND_CONTEXTS:
            raise ValueError(f"uncond_context={uncond_context!r}; allowed: {', '.join(UNCOND_CONTEXTS)}")
        vocab = config.vocabulary_map or {}
        height, width = (768 if height is None else height), (768 if width is None else width)
        for name, value in (("height", height), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % GRID_PIXELS:
                raise ValueError(f"Lumina-mGPT 2.0 {name}={value!r}: allowed positive multiples of {GRID_PIXELS} pixels "
                                 f"(default 768)")

        def tid(name, what):
            return token_id(name, vocab, tokenizer, what)

        bos = _bos_of(tokenizer, vocab)
        pad = getattr(tokenizer, "pad_token_id", None)
        res = resolution_token_ids((height, width), GRID_PIXELS, vocab, tokenizer)
        return cls(height // PIXELS_PER_TOKEN, width // PIXELS_PER_TOKEN, bos=bos, pad=bos if pad is None else int(pad),
                   boi=tid(BOI, "begin-of-image"), eoi=tid(EOI, "end-of-image"), newline=tid(NEWLINE, "end-of-line"),
                   resolution_tokens=res, uncond_context=uncond_context)

    kind = "lumina-mgpt-2"

    @property
    def num_image_tokens(self) -> int:
        return self.rows * self.cols

    @property
    def image_length(self) -> int:
        """Positions after the prompt: begin-of-image, two resolution tokens, ``R (C + 1)`` region tokens, end-of-image."""
        return 3 + self.rows * (self.cols + 1) + 1

    def prefix(self, prompt: Sequence[int]) -> list[int]:
        """``[BOS, *prompt, begin-of-image, height token, width token]``."""
        return [self.bos, *prompt, self.boi, *self.resolution_tokens]

    def uncond_visible(self, prompt_length: int) -> list[bool]:
        """What the unconditional rows see of the prefix: begin-of-image and the resolution tokens (BOS and
        prompt hidden), and with ``uncond_context="last-prompt-token"`` also the last token before them."""
        hidden = 1 + prompt_length - (self.uncond_context == "last-prompt-token")
        return [False] * hidden + [True] * (1 + prompt_length - hidden + 3)

    def full_sequence(self, prompt: Sequence[int], image_ids: Sequence[int]) -> list[int]:
        """The whole sequence the reference decoder reads: prefix, image ids with row ends, end-of-image."""
        seq = self.prefix(prompt)
        for i, t in enumerate(image_ids):
            seq.append(int(t))
            if i % self.cols == self.cols - 1:
                seq.append(self.newline)
        return seq + [self.eoi]


class Lumina2Prompts(LayoutPrompts):
    """Lumina-mGPT 2.0 prompt rows from the config and the tokenizer only (usable before the weights are read).

    Args: see :class:`Lumina2ImageModel` (``config`` instead of the backbone).
    """

    def __init__(self, config: ChameleonConfig, height: int | None = None, width: int | None = None, tokenizer: Any = None,
                 prompt_template: str | None = None, uncond_context: str = "begin-of-image"):
        self.layout = Lumina2Layout.build(config, height, width, tokenizer, uncond_context)
        self.config, self.tokenizer = config, tokenizer
        self.pixel_size = (self.layout.rows * PIXELS_PER_TOKEN, self.layout.cols * PIXELS_PER_TOKEN)
        self.prompt_template = prompt_template or LUMINA_PROMPT_TEMPLATE
        format_prompt(self.prompt_template, "", 1, 1)  # refuse a bad template now
        check_sequence_length(1, self.layout.image_length, config.max_position_embeddings,
                              f"{self.pixel_size[0]}x{self.pixel_size[1]} image")


def _vqmodel_parameters(config: ChameleonConfig) -> int:
    from transformers.models.chameleon.modeling_chameleon import ChameleonVQVAE

    with torch.device("meta"):
        return parameter_count(ChameleonVQVAE(config.vq_config))


def lumina2_memory(config: ChameleonConfig, layout: Lumina2Layout, window: int, dtype: torch.dtype | str,
                   guided: bool = True, prompt_length: int = DEFAULT_PROMPT_LENGTH,
                   parameters: int | None = None) -> MemoryEstimate:
    """Memory of a run from the config only (:func:`~csdgen.models._transformers.estimate_memory`).

    Sequence = ``prompt_length`` + :attr:`Lumina2Layout.image_length`; V = the MoVQGAN codes;
    fixed bytes include the copy of their ``lm_head`` rows. ``parameters`` default: the decoder
    counted on the ``meta`` device, without the ``vqmodel`` (the release holds none; it is
    dropped on load). 7B at 768 px in bfloat16, guided: about 16 GB of weights plus 10 GB of
    KV cache per image.
    """
    size = torch.empty((), dtype=resolve_dtype(dtype)).element_size()
    V = len(image_vocabulary(config))
    if parameters is None:
        with torch.device("meta"):
            parameters = parameter_count(ChameleonForConditionalGeneration(config)) - _vqmodel_parameters(config)
    return estimate_memory(parameters, size, config, prompt_length + layout.image_length, V, window, guided,
                           extra_fixed=V * config.hidden_size * size, image_tokens=layout.num_image_tokens)


def _unread_weights(folder: Path, model: torch.nn.Module) -> list[str]:
    """Parameters of ``model`` (``vqmodel`` left out) that no weight file of ``folder`` holds."""
    names = file_tensor_names(folder)
    return sorted(k for k in model.state_dict() if k not in names and not k.startswith("model.vqmodel."))


class Lumina2ImageModel(LayoutImageModel, Lumina2Prompts, ImageTokenModel):
    """Lumina-mGPT 2.0 text-to-image generation over a ``ChameleonForConditionalGeneration``.

    Args:
        backbone: the loaded model; height, width: pixels (multiples of 32; default 768);
        tokenizer: the checkpoint's tokenizer (required: it gives BOS);
        movqgan: a :class:`~csdgen.models.movqgan.MoVQGANDecoder` for :meth:`decode_images` (None: no decoding);
        prompt_template: ``{prompt}``, ``{width}``, ``{height}`` format string for string prompts
            (default the reference's, :data:`~csdgen.models.chameleon.LUMINA_PROMPT_TEMPLATE`).
        uncond_context: ``"begin-of-image"`` (default, the reference's CFG processor) or
            ``"last-prompt-token"`` (its SJD script's target; module docstring).

    Conditions: prompt strings (template, then the tokenizer without special tokens) or lists
    of token ids (the prompt without BOS, no template). BOS is always prepended.

    Attributes:
        defaults: ``FAMILY_DEFAULTS["lumina-mgpt-2"]``; reference_guidance: :class:`Lumina2Guidance`,
        the schedule the engine uses when the sampling settings are left to the model.

    Raises:
        ValueError: a bad size, missing special tokens or tokenizer, no MoVQGAN tokens, a sequence
            longer than ``max_position_embeddings``, a MoVQGAN of another codebook size or downsampling.
    """

    reference_guidance = Lumina2Guidance()
    memory_function = staticmethod(lumina2_memory)
    no_decoder = ("no MoVQGAN decoder: give vqgan_dir= (--vqgan DIR) with movqgan_270M.ckpt (SberAI's MoVQGAN 270M, "
                  "which Lumina-mGPT 2.0 decodes with)")

    def __init__(self, backbone: ChameleonForConditionalGeneration, height: int | None = None, width: int | None = None,
                 tokenizer: Any = None, movqgan: MoVQGANDecoder | None = None, prompt_template: str | None = None,
                 uncond_context: str = "begin-of-image"):
        config = backbone.config
        Lumina2Prompts.__init__(self, config, height, width, tokenizer, prompt_template, uncond_context)
        self.defaults = FAMILY_DEFAULTS["lumina-mgpt-2"]
        self._set_backbone(backbone, image_vocabulary(config))  # [V] vocabulary id per MoVQGAN code
        self.vqgan = movqgan
        if movqgan is not None and (movqgan.config.n_embed != self.codebook_size
                                    or movqgan.config.downsampling != PIXELS_PER_TOKEN):
            where = f" ({movqgan.source})" if getattr(movqgan, "source", None) else ""
            raise ValueError(f"MoVQGAN{where} has n_embed={movqgan.config.n_embed}, downsampling {movqgan.config.downsampling}; "
                             f"the checkpoint needs {self.codebook_size} and {PIXELS_PER_TOKEN}: give its own MoVQGAN "
                             f"(--vqgan)")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: torch.dtype | str = torch.float32,
                        device: str | torch.device = "cpu", height: int | None = None, width: int | None = None,
                        vqgan_dir: str | os.PathLike | None = None, prompt_template: str | None = None,
                        uncond_context: str = "begin-of-image") -> "Lumina2ImageModel":
        """Load a local Lumina-mGPT 2.0 folder, its tokenizer, and the MoVQGAN decoder when one is found.

        Args:
            path: the checkpoint folder (no hub downloads).
            vqgan_dir: folder holding ``movqgan_270M.ckpt`` (and optionally ``movqgan.yaml``); default:
                the checkpoint folder, its ``movqgan/`` or ``movqgan/270M/`` (the reference's place),
                else no decoder.

        Raises:
            FileNotFoundError: missing folder, config or weights.
            ValueError: bad dtype, size, template or special tokens (checked before the weights are
                read); decoder weights missing from the files; a bad MoVQGAN file.
        """
        from transformers.utils import logging as hf_logging

        folder = check_checkpoint(path, "Lumina-mGPT 2.0")
        dtype = resolve_dtype(dtype)
        tokenizer = load_tokenizer(folder)
        config = ChameleonConfig.from_pretrained(folder)
        Lumina2Prompts(config, height, width, tokenizer, prompt_template, uncond_context)  # refuse before reading weights
        image_vocabulary(config)
        movqgan_file = find_movqgan(folder, vqgan_dir)
        movqgan = None if movqgan_file is None else load_movqgan_decoder(movqgan_file, device=device)  # before the weights
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the release holds no vqmodel weights: transformers would report them missing
        try:
            backbone = load_backbone(folder, dtype, device)
        finally:
            hf_logging.set_verbosity(level)
        unread = _unread_weights(folder, backbone)
        if unread:
            raise ValueError(f"{str(folder)!r}: {len(unread)} decoder weights are in no weight file, e.g. {unread[:3]}")
        del backbone.model.vqmodel  # never used by Lumina-mGPT 2.0 (random here)
        return cls(backbone, height, width, tokenizer, movqgan, prompt_template, uncond_context)

    def codebook_embeddings(self) -> torch.Tensor | None:
        """``[V, 4]`` float32 MoVQGAN codebook when the decoder is loaded, else None (GSD / LANTERN need it)."""
        return None if self.vqgan is None else self.vqgan.quantize.embedding.weight.detach().float()
