"""GLM-Image (zai-org, 2026): its autoregressive prior as an image-token model; the picture from diffusers.

GLM-Image is an AR "prior" (transformers ``GlmImageForConditionalGeneration``, a GLM-4 decoder
with multimodal rotary positions, "mrope") that writes semantic VQ codes, followed by a
diffusion decoder (diffusers ``GlmImagePipeline``: a DiT, a glyph text encoder and a VAE). csdgen
decodes the prior's tokens with any of its methods; :meth:`GlmImageModel.decode_images` hands
them to ``GlmImagePipeline.__call__(prior_token_ids=...)``, which then skips its own
``generate_prior_tokens`` (the pipeline's AR step is replaced, not copied).

Sequence of one text-to-image row (transformers 5.24 ``GlmImageProcessor`` and
``GlmImageModel.get_rope_index``; diffusers 0.42.1 ``GlmImagePipeline.generate_prior_tokens``):

* prompt: the chat template of the processor applied to ``[{"role": "user", "content":
  [{"type": "text", "text": prompt}]}]``, then ``<sop>{H/32} {W/32}<eop><sop>{h} {w}<eop>`` and
  the image start token ``<|dit_token_16384|>`` (the tokenizer's ``bos_token``), tokenised in
  one call (special tokens added unless the text starts with BOS, as the processor does);
* then, generated, the **preview grid** of ``h x w`` codes, ``h = int(sqrt(r) * 16)``, ``w =
  int(sqrt(1 / r) * 16)`` with ``r = (H/32) / (W/32)`` (16 x 16 = 256 for a square image), and
  directly after it (no separator) the **target grid** of ``H/32 x W/32`` codes, then the end
  token ``<|dit_token_16385|>``. csdgen's image positions ``0 .. N - 1`` are both grids in this
  order, ``N = h w + (H/32)(W/32)``; the end token is not generated.

Token ids: the prior's ``lm_head`` has ``text_config.vision_vocab_size`` (16512) outputs, which
are also the first 16512 ids of the text vocabulary: ids ``0 .. V - 1`` are the semantic VQ codes
(``V = vq_config.num_embeddings`` = 16384), 16384 and 16385 the image start and end tokens. So a
code's id is the code itself; logits are the ``lm_head`` rows ``0 .. V - 1`` (the reference
samples over all 16512 outputs: csdgen never lets a non-code id into an image).

Positions (``get_rope_index``): a prompt token at index ``j`` of its row (padding skipped) has
position ``(j, j, j)`` (temporal, height, width). With ``P`` prompt tokens the preview grid has
base ``b0 = P``: code ``(r, c)`` at ``(b0, b0 + r, b0 + c)``; the target grid has base ``b1 = b0
+ max(h, w)``: code ``(r, c)`` at ``(b1, b1 + r, b1 + c)``; the end token ``b1 + max(H/32, W/32)``.
The session maps the per-row 1-D positions of :class:`~csdgen.models._ragged.RaggedSession`
(prompt index, or ``P + image position``) to these triples, so per-image windows, draft trees and
rollbacks see the reference's positions.

Guidance: the AR stage of GLM-Image has none (``generate_prior_tokens`` calls ``generate(...,
do_sample=True)`` with the model's generation_config: T 0.9, top-p 0.75, top-k the whole vision
vocabulary); the pipeline's ``guidance_scale`` (1.5) is the DiT's. :meth:`GlmImageModel.start`
refuses guided sessions: there is no unconditional prompt to guide with.

On disk (the diffusers layout of ``zai-org/GLM-Image``): ``model_index.json``,
``vision_language_encoder/`` (the AR model), ``processor/`` (tokenizer, chat template, image
processor), ``transformer/``, ``vae/``, ``text_encoder/``, ``tokenizer/`` (the glyph encoder's),
``scheduler/``. A folder holding only the AR model (``model_type`` ``glm_image``) also loads;
it decodes no images unless its parent is the pipeline folder.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from transformers import DynamicCache, GlmImageConfig, GlmImageForConditionalGeneration

from ._transformers import (
    cache_kwargs,
    TOKENIZER_FILES, MemoryEstimate, PaddedRows, check_checkpoint, check_sequence_length, check_token_ids,
    encode_each_once, estimate_memory, format_prompt, meta_parameter_count, parameter_count, resolve_dtype, token_id,
)
from ._conditions import check_conditions
from ._ragged import RaggedSession
from .base import ImageTokenModel
from .defaults import FAMILY_DEFAULTS
from .quantize import load_pretrained

__all__ = [
    "GlmImageFolders", "GlmImageLayout", "GlmImagePrompts", "GlmImageModel", "glm_image_memory", "decoder_parameters",
    "PIXELS_PER_TOKEN", "DEFAULT_SIZE", "DECODER_COMPONENTS",
]

#: pixels per prior token along a side (``GlmImageProcessor._get_target_shape``: ``factor = 32``)
PIXELS_PER_TOKEN = 32
#: the preview grid's side for a square image (``factor // 2``)
PREVIEW_SIDE = 16
#: default image size in pixels (the SGLang and vLLM-Omni examples of GLM-Image: 1024 x 1024)
DEFAULT_SIZE = 1024
#: prompt tokens the memory check assumes when the prompts are not known
DEFAULT_PROMPT_LENGTH = 128
#: the pipeline's weight folders besides the AR model (the DiT, the glyph text encoder, the VAE)
DECODER_COMPONENTS = ("transformer", "text_encoder", "vae")
#: diffusers' defaults of ``GlmImagePipeline.__call__`` for the DiT stage
DIT_STEPS, DIT_GUIDANCE = 50, 1.5
_USER_TEXT = "{prompt}"


@dataclass(frozen=True)
class GlmImageFolders:
    """Where a GLM-Image checkpoint keeps its parts.

    Attributes:
        model: the AR model's folder (``config.json`` with ``model_type`` ``glm_image``).
        processor: the folder with the tokenizer (and chat template), or None.
        pipeline: the diffusers pipeline folder (``model_index.json``), or None (no image decoder).
    """

    model: Path
    processor: Path | None
    pipeline: Path | None

    @classmethod
    def find(cls, path: str | os.PathLike) -> "GlmImageFolders":
        """The parts of the pipeline folder ``path`` (``model_index.json``) or of an AR-model folder.

        Raises:
            FileNotFoundError: no such folder, or neither a pipeline folder nor a folder with config.json.
        """
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"GLM-Image checkpoint folder {str(path)!r} does not exist (give a local folder; no downloads)")
        if (folder / "model_index.json").is_file():
            processor = folder / "processor"
            return cls(folder / "vision_language_encoder", processor if _has_tokenizer(processor) else None, folder)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{str(path)!r} has neither model_index.json (the diffusers GLM-Image folder) nor "
                                    f"config.json (its vision_language_encoder/)")
        processor = folder if _has_tokenizer(folder) else folder.parent / "processor"
        pipeline = folder.parent if (folder.parent / "model_index.json").is_file() else None
        return cls(folder, processor if _has_tokenizer(processor) else None, pipeline)


def _has_tokenizer(folder: Path) -> bool:
    return folder.is_dir() and any((folder / name).is_file() for name in TOKENIZER_FILES)


def pipeline_class_name(folder: str | os.PathLike) -> str | None:
    """``_class_name`` of a diffusers ``model_index.json`` in ``folder`` (None without one)."""
    file = Path(folder) / "model_index.json"
    if not file.is_file():
        return None
    from csdgen.jsonio import read_json

    return read_json(file, what="a diffusers pipeline index").get("_class_name")


@dataclass(frozen=True)
class GlmImageLayout:
    """The two grids of one image and their positions.

    Attributes:
        height, width: pixels (multiples of :data:`PIXELS_PER_TOKEN`).
        target: ``(rows, cols)`` of the target grid, ``(height / 32, width / 32)``.
        preview: ``(rows, cols)`` of the preview grid (the processor's rule, see the module docstring).
    """

    height: int
    width: int
    target: tuple[int, int]
    preview: tuple[int, int]

    @classmethod
    def build(cls, height: int | None = None, width: int | None = None,
              preview: tuple[int, int] | None = None) -> "GlmImageLayout":
        """Check the size (pixels) and derive the grids.

        Args:
            height, width: default :data:`DEFAULT_SIZE`.
            preview: override of the preview grid (``GlmImageProcessor``'s rule when None; the
                tests use a small one for the exact-distribution test).

        Raises:
            ValueError: a side that is not a positive multiple of 32 px, an aspect ratio whose
                preview grid would be empty, or a bad preview override.
        """
        sizes = {"height": DEFAULT_SIZE if height is None else height, "width": DEFAULT_SIZE if width is None else width}
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < PIXELS_PER_TOKEN or value % PIXELS_PER_TOKEN:
                raise ValueError(f"GLM-Image {name}={value!r} px: allowed positive multiples of {PIXELS_PER_TOKEN} px")
        rows, cols = sizes["height"] // PIXELS_PER_TOKEN, sizes["width"] // PIXELS_PER_TOKEN
        if preview is None:
            ratio = rows / cols
            preview = (int(math.sqrt(ratio) * PREVIEW_SIDE), int(math.sqrt(1 / ratio) * PREVIEW_SIDE))
            if min(preview) < 1:
                raise ValueError(f"GLM-Image {sizes['height']} x {sizes['width']} px: the preview grid would be "
                                 f"{preview[0]} x {preview[1]} tokens; allowed: aspect ratios up to 256 : 1")
        elif len(preview) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in preview):
            raise ValueError(f"preview={preview!r}: allowed (rows, cols), two integers >= 1")
        return cls(sizes["height"], sizes["width"], (rows, cols), tuple(preview))

    @property
    def preview_tokens(self) -> int:
        return self.preview[0] * self.preview[1]

    @property
    def num_image_tokens(self) -> int:
        """N: the preview grid's codes, then the target grid's."""
        return self.preview_tokens + self.target[0] * self.target[1]

    @property
    def position_span(self) -> int:
        """Positions the generated part spans after the prompt: ``max(preview) + max(target) + 1`` (end token)."""
        return max(self.preview) + max(self.target) + 1

    def offsets(self) -> torch.Tensor:
        """``[3, N + 1]`` int64: (temporal, height, width) of image position ``i`` minus the prompt length ``P``.

        Column ``N`` is the end token's (``get_rope_index``'s end marker).
        """
        columns, base = [], 0
        for rows, cols in (self.preview, self.target):
            r = torch.arange(rows).repeat_interleave(cols)
            c = torch.arange(cols).repeat(rows)
            columns.append(torch.stack([torch.full_like(r, base), base + r, base + c]))
            base += max(rows, cols)
        columns.append(torch.full((3, 1), base, dtype=torch.long))
        return torch.cat(columns, dim=1)

    def suffix_text(self, grid_bos: str, grid_eos: str, bos: str) -> str:
        """``<sop>{H/32} {W/32}<eop><sop>{h} {w}<eop><bos>``: what ``GlmImageProcessor`` appends to a t2i prompt."""
        (th, tw), (ph, pw) = self.target, self.preview
        return f"{grid_bos}{th} {tw}{grid_eos}{grid_bos}{ph} {pw}{grid_eos}{bos}"

    def image_grid_thw(self) -> torch.Tensor:
        """``[2, 3]``: the processor's ``image_grid_thw`` of a t2i row (target grid, then preview)."""
        return torch.tensor([[1, *self.target], [1, *self.preview]])

    def maps_grid(self) -> tuple[int, int]:
        """``(rows, cols)`` with ``rows * cols = N`` for the acceptance maps (both grids in one stream).

        ``cols`` = the target grid's width when the preview fills whole rows of it and the rows fit
        the image's height in pixels (square 512, 1024, 2048 px: the target grid then shows in place
        under the preview); else the factorisation of N whose shape is closest to the image's with
        ``rows <= height`` and ``cols <= width`` pixels (the maps then show the stream, not the
        picture's layout; between two equally close shapes the wider); ``(1, N)`` when none fits.
        """
        n, cols = self.num_image_tokens, self.target[1]
        if n % cols == 0 and n // cols <= self.height:
            return n // cols, cols
        pairs = [(n // c, c) for c in range(1, n + 1) if n % c == 0 and n // c <= self.height and c <= self.width]
        if not pairs:
            return 1, n
        def mismatch(rc: tuple[int, int]) -> tuple[Fraction, int]:  # exact ratio of the two aspects, >= 1; then wider first
            a, b = rc[0] * self.width, rc[1] * self.height
            return Fraction(max(a, b), min(a, b)), -rc[1]

        return min(pairs, key=mismatch)


def _processor_chat_template(processor: Any) -> bool:
    return processor is not None and getattr(processor, "chat_template", None) is not None


class GlmImagePrompts:
    """GLM-Image prompt rows from the config and the processor only (usable before the weights are loaded).

    Args:
        config: the AR model's ``GlmImageConfig``.
        processor: the checkpoint's ``GlmImageProcessor`` (its tokenizer and chat template), or a
            bare tokenizer, or None (token-id prompts need a tokenizer for the suffix all the same).
        height, width: pixels (default 1024); preview: see :meth:`GlmImageLayout.build`.
        prompt_template: ``{prompt}``, ``{width}``, ``{height}`` applied to prompt strings before
            the chat template (default ``"{prompt}"``).

    Raises:
        ValueError: bad size or template; special tokens missing or disagreeing with the config.
    """

    def __init__(self, config: GlmImageConfig, processor: Any = None, height: int | None = None, width: int | None = None,
                 preview: tuple[int, int] | None = None, prompt_template: str = _USER_TEXT):
        self.config = config
        self.layout = GlmImageLayout.build(height, width, preview)
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.prompt_template = prompt_template
        format_prompt(prompt_template, "", 1, 1)  # refuse a bad template now
        self.num_image_tokens = self.layout.num_image_tokens
        self.image_size = (self.layout.height, self.layout.width)
        self.codebook_size = int(config.vq_config.num_embeddings)
        text = config.text_config
        if not self.codebook_size <= config.image_start_token_id or self.codebook_size > text.vision_vocab_size:
            raise ValueError(f"vq_config.num_embeddings={self.codebook_size}: the codes must lie below the image start "
                             f"id {config.image_start_token_id} and within vision_vocab_size={text.vision_vocab_size}")
        self.special = self._special_ids()
        check_sequence_length(1, self.layout.position_span, text.max_position_embeddings,
                              f"{self.layout.height}x{self.layout.width} image")

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, **kwargs) -> "GlmImagePrompts":
        """From a checkpoint's config and processor (no weights read)."""
        parts = GlmImageFolders.find(folder)
        return cls(GlmImageConfig.from_pretrained(check_checkpoint(parts.model, "GLM-Image")), load_processor(parts.processor),
                   **kwargs)

    def _special_ids(self) -> dict[str, int]:
        """Ids of the image start / end tokens (the tokenizer's ``bos_token`` / ``eos_token``, checked against
        the config's ``image_start_token_id`` / ``image_end_token_id``), ``<sop>`` / ``<eop>`` and pad."""
        config, tok = self.config, self.tokenizer
        ids = {"image_start": int(config.image_start_token_id), "image_end": int(config.image_end_token_id),
               "pad": int(config.text_config.pad_token_id)}
        if tok is None:
            return ids
        names = {"image_start": tok.bos_token, "image_end": tok.eos_token, "grid_bos": getattr(tok, "grid_bos_token", None),
                 "grid_eos": getattr(tok, "grid_eos_token", None), "pad": tok.pad_token}
        for key, name in names.items():
            if name is None:
                if key in ("grid_bos", "grid_eos"):
                    raise ValueError(f"the GLM-Image tokenizer has no {key}_token (expected '<sop>' / '<eop>' in "
                                     f"tokenizer_config.json): not a GLM-Image processor")
                continue
            found = token_id(name, None, tok, f"GLM-Image {key} token")
            if key in ("image_start", "image_end") and found != ids[key]:
                raise ValueError(f"GLM-Image {key} token {name!r}: the tokenizer says id {found}, config.json {ids[key]}; "
                                 f"allowed: equal ids")
            ids[key] = found
        self._names = {k: v for k, v in names.items() if v is not None}
        return ids

    # -- prompts --------------------------------------------------------------------------

    def _need_tokenizer(self, what: str) -> None:
        if self.tokenizer is None:
            raise ValueError(f"{what} needs the GLM-Image tokenizer (the checkpoint's processor/ folder); none was found")

    def suffix_text(self) -> str:
        """The text after the prompt: grid sizes and the image start token (:meth:`GlmImageLayout.suffix_text`)."""
        self._need_tokenizer("the prompt suffix")
        n = self._names
        return self.layout.suffix_text(n["grid_bos"], n["grid_eos"], n["image_start"])

    def chat_text(self, prompt: str) -> str:
        """The prompt after the template and the processor's chat template (one user message with one text part)."""
        h, w = self.image_size
        text = format_prompt(self.prompt_template, prompt, w, h)
        if _processor_chat_template(self.processor):
            messages = [{"role": "user", "content": [{"type": "text", "text": text}]}]
            text = self.processor.apply_chat_template(messages, tokenize=False)
        return text

    def prompt_ids(self, condition: str | Sequence[int]) -> list[int]:
        """One condition -> the prompt row, up to and including the image start token.

        A string goes through :meth:`chat_text`, gets :meth:`suffix_text` appended and is tokenised
        in one call (special tokens added unless it starts with BOS), as
        ``GlmImageProcessor.apply_chat_template(..., tokenize=True, target_h=, target_w=)`` does. A
        list of ids is the tokenised prompt: the suffix's ids are appended.

        Raises:
            ValueError: no tokenizer, or ids outside the vocabulary.
        """
        self._need_tokenizer("a GLM-Image prompt")
        if isinstance(condition, str):
            text = self.chat_text(condition) + self.suffix_text()
            starts_with_bos = text.startswith(self.tokenizer.bos_token or "\0")
            return list(self.tokenizer(text, add_special_tokens=not starts_with_bos)["input_ids"])
        ids = check_token_ids(condition, self.config.text_config.vocab_size)
        return ids + list(self.tokenizer(self.suffix_text(), add_special_tokens=False)["input_ids"])

    def prompt_rows(self, conditions: Sequence[str | Sequence[int]]) -> tuple[list[list[int]], list[list[int]]]:
        """``(cond rows, [])``: GLM-Image's AR stage has no unconditional rows."""
        if isinstance(conditions, str) or not len(conditions):
            raise ValueError("conditions must be a non-empty list of prompt strings or token-id lists")
        return encode_each_once(self.prompt_ids, check_conditions(conditions)), []

    def check_length(self, prompt_length: int) -> None:
        """Refuse a prompt too long for ``max_position_embeddings`` with the image's positions.

        Raises:
            ValueError: naming both lengths and the longest prompt allowed.
        """
        check_sequence_length(prompt_length, self.layout.position_span, self.config.text_config.max_position_embeddings)

    def prompt_length(self, conditions: Sequence[str | Sequence[int]]) -> int:
        """Tokens of the longest prompt row (image start token included)."""
        return max(len(r) for r in self.prompt_rows(conditions)[0])


def load_processor(folder: Path | None) -> Any:
    """``GlmImageProcessor`` of ``folder`` (its image processor config present), else its tokenizer, else None."""
    if folder is None:
        return None
    folder = Path(folder)
    if any((folder / name).is_file() for name in ("processor_config.json", "preprocessor_config.json")):
        from transformers import GlmImageProcessor

        from ._transformers import check_json_files

        check_json_files(folder)

        return GlmImageProcessor.from_pretrained(folder)
    from ._transformers import load_tokenizer

    return load_tokenizer(folder)


def pipeline_problem(pipeline: Path | None, processor_given: bool = True) -> str | None:
    """Why the image decoder of a GLM-Image checkpoint whose pipeline folder is ``pipeline`` cannot run (one line),
    or None; reads no weights (what :attr:`GlmImageModel.decoder_problem` says, and the commands before loading).

    Args:
        pipeline: the diffusers pipeline folder (:attr:`GlmImageFolders.pipeline`), None without one.
        processor_given: the AR model's processor is at hand (then ``processor/`` is not needed).
    """
    if pipeline is None:
        return ("this GLM-Image checkpoint has no diffusers pipeline (model_index.json with transformer/, vae/, "
                "text_encoder/): give the pipeline folder to decode images")
    try:
        import diffusers  # noqa: F401
    except ImportError:
        return "GLM-Image's image decoder needs diffusers: pip install -c constraints.txt \".[glm]\" in the csdgen checkout"
    missing = missing_components(pipeline, given=("vision_language_encoder",) + (("processor",) if processor_given else ()))
    if missing:
        return (f"the GLM-Image pipeline folder {str(pipeline)!r} lacks "
                f"{', '.join(name.replace(' ', '/ ', 1) if ' ' in name else name + '/' for name in missing)} "
                f"(model_index.json lists them; the image decoder loads them): copy the whole zai-org/GLM-Image folder")
    return None


def missing_components(pipeline: Path, given: Sequence[str] = ()) -> list[str]:
    """The components ``model_index.json`` of ``pipeline`` lists whose folders are not there (``given`` ones aside).

    A component listed as ``[null, null]`` is optional in diffusers and is not asked for.
    """
    from csdgen.jsonio import read_json

    index = read_json(Path(pipeline) / "model_index.json", what="a diffusers pipeline index")
    missing = []
    for name, value in index.items():
        if name.startswith("_") or not isinstance(value, list) or all(v is None for v in value) or name in given:
            continue
        folder = Path(pipeline) / name
        if not folder.is_dir():
            missing.append(name)
        elif not any(folder.glob("*.json")):  # every component saves its config (config.json, scheduler_config.json, ...)
            missing.append(f"{name} (empty: no config)")
        elif name in DECODER_COMPONENTS and not any(any(folder.glob(pattern)) for pattern in ("*.safetensors", "*.bin")):
            missing.append(f"{name} (no weights)")
    return missing


def decoder_parameters(pipeline: Path | None) -> int:
    """Parameters of the pipeline's DiT, glyph text encoder and VAE, read from their safetensors headers (0 if absent)."""
    if pipeline is None:
        return 0
    from safetensors import safe_open

    total = 0
    for name in DECODER_COMPONENTS:
        for file in sorted((Path(pipeline) / name).glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                total += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    return total


def glm_image_memory(config: GlmImageConfig, layout: GlmImageLayout, window: int, dtype: torch.dtype | str,
                     prompt_length: int = DEFAULT_PROMPT_LENGTH, parameters: int | None = None,
                     decoder: int = 0) -> MemoryEstimate:
    """Memory of a run (:func:`~csdgen.models._transformers.estimate_memory`), one row per image (no guidance).

    Sequence = ``prompt_length + N``; fixed bytes = the AR model's parameters (counted on the
    ``meta`` device when ``parameters`` is None: GLM-Image's 10.1 B, vision encoder included) plus
    ``decoder`` parameters (:func:`decoder_parameters`: the DiT, glyph encoder and VAE the image
    decoder loads), all at ``dtype``.
    """
    size = torch.empty((), dtype=resolve_dtype(dtype)).element_size()
    count = meta_parameter_count(GlmImageForConditionalGeneration, config) if parameters is None else parameters
    return estimate_memory(count, size, config.text_config, prompt_length + layout.num_image_tokens,
                           int(config.vq_config.num_embeddings), window, guided=False, extra_fixed=decoder * size,
                           image_tokens=layout.num_image_tokens)


class GlmImageModel(GlmImagePrompts, ImageTokenModel):
    """GLM-Image's AR prior over a ``GlmImageForConditionalGeneration``; images by diffusers' ``GlmImagePipeline``.

    Args:
        backbone: the loaded AR model (eval mode is set here).
        processor: its ``GlmImageProcessor`` or tokenizer (None: token-id prompts only, and then
            a tokenizer is still needed for the suffix).
        height, width, preview, prompt_template: see :class:`GlmImagePrompts`.
        pipeline: the diffusers pipeline folder for :meth:`decode_images` (None: no decoder).
        dit_steps, dit_guidance_scale: the DiT's denoising steps and guidance (diffusers'
            defaults 50 and 1.5); decoder_seed: seed of the DiT's initial noise (a fixed seed
            makes an image a function of its tokens).

    Attributes:
        grid: :meth:`GlmImageLayout.maps_grid` (both grids in one stream; see there).
        defaults: the ``glm-image`` row of ``FAMILY_DEFAULTS``.
    """

    def __init__(self, backbone: GlmImageForConditionalGeneration, processor: Any = None, height: int | None = None,
                 width: int | None = None, preview: tuple[int, int] | None = None, prompt_template: str = _USER_TEXT,
                 pipeline: str | os.PathLike | None = None, dit_steps: int = DIT_STEPS,
                 dit_guidance_scale: float = DIT_GUIDANCE, decoder_seed: int = 0):
        GlmImagePrompts.__init__(self, backbone.config, processor, height, width, preview, prompt_template)
        self.backbone = backbone.eval()
        self.defaults = FAMILY_DEFAULTS["glm-image"]
        self.device = next(backbone.parameters()).device
        self.dtype = next(backbone.parameters()).dtype
        self.grid = self.layout.maps_grid()
        self.head = backbone.lm_head.weight.detach().narrow(0, 0, self.codebook_size)  # [V, hidden]: ids 0..V-1 = codes
        self.offsets = self.layout.offsets().to(self.device)  # [3, N + 1]
        self.pipeline_folder = None if pipeline is None else Path(pipeline)
        self.dit_steps, self.dit_guidance_scale, self.decoder_seed = dit_steps, dit_guidance_scale, decoder_seed
        self._pipeline = None

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: torch.dtype | str = torch.float32,
                        device: str | torch.device = "cpu", height: int | None = None, width: int | None = None,
                        prompt_template: str = _USER_TEXT, **kwargs) -> "GlmImageModel":
        """Load the AR model of a GLM-Image pipeline folder (or of its ``vision_language_encoder/``) and its processor.

        Args:
            path: the diffusers folder of ``zai-org/GLM-Image`` or its AR-model folder (no downloads).
            kwargs: ``preview``, ``dit_steps``, ``dit_guidance_scale``, ``decoder_seed`` (:class:`GlmImageModel`).

        Raises:
            FileNotFoundError: missing folder, config or weights.
            ValueError: bad dtype, size or template, missing special tokens (checked before the weights are read).
        """
        parts = GlmImageFolders.find(path)
        folder = check_checkpoint(parts.model, "GLM-Image")
        dtype = resolve_dtype(dtype)
        processor = load_processor(parts.processor)
        GlmImagePrompts(GlmImageConfig.from_pretrained(folder), processor, height, width, kwargs.get("preview"),
                        prompt_template)  # sizes and special tokens before the weights
        backbone = load_pretrained(GlmImageForConditionalGeneration, folder, dtype=dtype, device=device)
        return cls(backbone, processor, height, width, prompt_template=prompt_template, pipeline=parts.pipeline, **kwargs)

    # -- the engine's interface ------------------------------------------------------------

    def start(self, conditions, batch_size, guided):
        """Open a session over prompt strings or token-id lists (unguided only).

        Raises:
            ValueError: guidance asked for (GLM-Image's AR stage has no unconditional prompt),
                bad conditions, ``batch_size`` differing from their number, a too-long prompt.
        """
        if guided:
            raise ValueError("GLM-Image's AR prior runs without classifier-free guidance (diffusers' GlmImagePipeline "
                             "samples it unguided; its guidance_scale is the DiT's): allowed guidance_scale 1")
        if conditions is None:
            raise ValueError("GLM-Image needs prompts: a non-empty list of prompt strings or token-id lists")
        rows, _ = self.prompt_rows(conditions)
        if batch_size is not None and batch_size != len(rows):
            raise ValueError(f"batch_size={batch_size} differs from the {len(rows)} conditions given")
        self.check_length(max(len(r) for r in rows))
        return _GlmImageSession(self, rows)

    def codebook_embeddings(self) -> torch.Tensor:
        """``[V, D]`` float32: the semantic VQ codebook (``model.vqmodel.quantize.embedding``)."""
        return self.backbone.model.vqmodel.quantize.embedding.weight.detach().float()

    def memory(self, window: int, prompt_length: int = DEFAULT_PROMPT_LENGTH) -> MemoryEstimate:
        """:func:`glm_image_memory` of this model (its dtype, parameter count and decoder files)."""
        return glm_image_memory(self.config, self.layout, window, self.dtype, prompt_length, parameter_count(self.backbone),
                                decoder_parameters(self.pipeline_folder))

    # -- images -----------------------------------------------------------------------------

    @property
    def decoder_problem(self) -> str | None:
        """Why :meth:`decode_images` cannot run here (one line), or None (:func:`pipeline_problem`)."""
        return pipeline_problem(self.pipeline_folder, processor_given=self.processor is not None)

    def decoder(self):
        """The diffusers ``GlmImagePipeline`` of the checkpoint, loaded on first use with this model as its AR stage.

        Raises:
            NotImplementedError: no pipeline folder or no diffusers (:attr:`decoder_problem`).
        """
        if self._pipeline is None:
            problem = self.decoder_problem
            if problem is not None:
                raise NotImplementedError(problem)
            from diffusers import GlmImagePipeline
            from diffusers.utils import logging as diffusers_logging

            extra = {} if self.processor is None else {"processor": self.processor}
            level = diffusers_logging.get_verbosity()
            diffusers_logging.set_verbosity_error()  # passing our own components makes diffusers say it cannot check their type
            try:
                pipe = GlmImagePipeline.from_pretrained(self.pipeline_folder, vision_language_encoder=self.backbone,
                                                        dtype=self.dtype, local_files_only=True, **extra)
            finally:
                diffusers_logging.set_verbosity(level)
            pipe.set_progress_bar_config(disable=True)
            if getattr(self.backbone, "hf_device_map", None):  # split by a device map: accelerate places the AR model,
                for name, part in pipe.components.items():  # and pipe.to() refuses a pipeline holding offloaded modules
                    if name != "vision_language_encoder" and isinstance(part, torch.nn.Module):
                        part.to(self.device)
                self._pipeline = pipe
            else:
                self._pipeline = pipe.to(self.device)
        return self._pipeline

    def prior_token_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens ``[B, N]`` -> ``[B, 4 (H/32)(W/32)]`` int64: the target grid upsampled 2x (nearest), what
        ``GlmImagePipeline.generate_prior_tokens`` returns (its ``_upsample_token_ids`` applied per image)."""
        from diffusers import GlmImagePipeline

        rows, cols = self.layout.target
        target = tokens[:, self.layout.preview_tokens :]
        return torch.cat([GlmImagePipeline._upsample_token_ids(t, rows, cols) for t in target])

    decode_takes_prompts = True  # runs hand the prompts over: the glyph encoder reads the quoted text in them
    live_preview = False  # a decode runs the whole DiT: the demo shows the picture once the tokens are done

    def decode_images(self, tokens: torch.Tensor, prompts: Sequence[str] | None = None) -> torch.Tensor:
        """Image tokens ``[B, N]`` -> ``[B, 3, H, W]`` float32 in [-1, 1] by diffusers' ``GlmImagePipeline``.

        Args:
            tokens: both grids, as generated (the preview is not used by the DiT).
            prompts: the prompt of each image (the glyph encoder renders the quoted text in it);
                None: ``""`` for each (no glyphs).

        Raises:
            NotImplementedError: no decoder (:attr:`decoder_problem`). ValueError: wrong shape or ids.
        """
        if tokens.ndim != 2 or tokens.shape[1] != self.num_image_tokens:
            raise ValueError(f"tokens of shape {tuple(tokens.shape)}: expected [B, {self.num_image_tokens}]")
        if tokens.numel() and not (0 <= int(tokens.min()) and int(tokens.max()) < self.codebook_size):
            raise ValueError(f"image tokens must lie in 0..{self.codebook_size - 1}")
        pipe = self.decoder()
        B = tokens.shape[0]
        prompts = [""] * B if prompts is None else [str(p) for p in prompts]
        if len(prompts) != B:
            raise ValueError(f"{len(prompts)} prompts for {B} images: give one per image")
        generator = torch.Generator(device=self.device).manual_seed(self.decoder_seed)
        with torch.no_grad():
            out = pipe(prompt=prompts, height=self.layout.height, width=self.layout.width,
                       prior_token_ids=self.prior_token_ids(tokens.to(self.device)), num_inference_steps=self.dit_steps,
                       guidance_scale=self.dit_guidance_scale, generator=generator, output_type="pt")
        return (out.images.float() * 2 - 1).clamp(-1, 1)


class _GlmImageSession(RaggedSession):
    """Per-row KV-cached session over left-padded prompt rows (no uncond rows, no row ends), mrope positions."""

    #: the mrope positions read each row's prompt length (``prompt_lengths``), which the static
    #: engine's batch slots do not follow: this family decodes on the eager engine
    static_path = False

    def __init__(self, model: GlmImageModel, rows: list[list[int]]):
        self.model = model
        self.rows = PaddedRows(rows, model.special["pad"], model.device)
        super().__init__(batch_size=len(rows), guided=False, cache=DynamicCache(config=model.config.text_config),
                         prompt_ids=self.rows.ids, prompt_valid=self.rows.mask, num_image_tokens=model.num_image_tokens,
                         device=model.device, filler=model.special["pad"])

    def mrope_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """``[R, S]`` per-row 1-D positions (prompt index, or prompt length + image position) -> ``[3, R, S]``."""
        prompt = self.prompt_lengths.to(positions.device)[:, None]  # [R, 1]
        image = (positions - prompt).clamp(0, self.model.num_image_tokens)
        table = self.model.offsets[:, image] + prompt  # [3, R, S]
        return torch.where(positions >= prompt, table, positions.expand(3, -1, -1))

    def _logits(self, ids, attention_mask, position_ids, out, prefill):
        with torch.no_grad():
            hidden = self.model.backbone.model.language_model(
                input_ids=ids, attention_mask=attention_mask, position_ids=self.mrope_positions(position_ids),
                **cache_kwargs(self.kv.cache), use_cache=True).last_hidden_state
            hidden = hidden.gather(1, out[..., None].expand(-1, -1, hidden.shape[-1]))
            return F.linear(hidden, self.model.head).float()  # [R, W, V]
