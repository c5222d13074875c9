"""Chameleon-format text-to-image models: Lumina-mGPT and Anole, on transformers' Chameleon.

transformers' ``ChameleonForConditionalGeneration.forward`` sets every image-token logit to
the dtype minimum, so this adapter runs ``model.model(...)`` (the decoder stack, with its KV
cache) and applies the ``lm_head`` rows of the image tokens itself. Image tokens are the
vocabulary entries named ``IMGIMG...`` (``config.vocabulary_map``); their codebook index comes
from transformers' ``ChameleonImageVocabularyMapping.bpe2img``; column ``v`` of the returned
logits is codebook entry ``v``. Nothing is hard-coded by id: special tokens (BOS ``<s>``, pad
``<pad>`` included) are looked up by name in ``config.vocabulary_map`` and the tokenizer. The
converters (transformers' ``convert_chameleon_weights_to_hf.py``, Lumina-mGPT's copy of it) write
config.json without ``bos_token_id``, so ChameleonConfig's default 1 (= ``<pad>``; ``<s>`` is 0)
would be read: config ids are never used.

Image size (Lumina-mGPT): the checkpoints are released at one size each (Alpha-VLLM/Lumina-mGPT
README: Lumina-mGPT-7B-512, -768, -768-Omni, -1024, Lumina-mGPT-34B-512; its demos take
``--target_size`` in 512 / 768 / 1024 and say it must match the checkpoint), and its config.json
has no size field (``ChameleonXLLMXConfig`` adds only ``z_loss_weight``). So the size comes from
the checkpoint's name (:func:`lumina_size_from_names`), else it must be given: nothing is guessed.

VQ weights: Lumina-mGPT's fine-tuning deletes ``model.vqmodel`` before training and saves the
rest (``finetune_solver.py``, ``xllmx/util/ckpt.py``), so its checkpoints hold no
``model.vqmodel.*`` tensors and transformers initialises that part at random. Whether the files
hold the codebook is read from their headers at load time (:func:`stores_codebook`); without it
:meth:`ChameleonImageModel.codebook_embeddings` (GSD, LANTERN) raises
:class:`~csdgen.models.base.CodebookUnavailable` unless a VQGAN is given (``vqgan=``, CLI
``--vqgan PATH``), never returning the random table.

Checkpoints: transformers' Chameleon layout, or Lumina-mGPT's (architecture
``ChameleonXLLMXForConditionalGeneration``, ``self_attn.q_norm``/``k_norm`` weight and bias of
shape ``[model_parallel_size, head_dim]``, shared by the heads of each shard; its
``ChameleonLayerNorm.repeat_param``). The latter are expanded to ``[heads, head_dim]`` on load
(:func:`load_backbone`): only those small tensors are read a second time.

Sequence layouts (one row per image; ``P`` = prompt token ids, without BOS):

* ``"lumina"`` (Lumina-mGPT, Alpha-VLLM/Lumina-mGPT ``data/item_processor.py``)::

      <s> P <racm3:break> <reserved{8800+H/32}> <reserved{8800+W/32}>
          row_0 <reserved08799> row_1 <reserved08799> ... row_{R-1} <reserved08799> <eoss>

  ``<racm3:break>`` = begin-of-image, ``<eoss>`` = end-of-image, ``<reserved08799>`` =
  end-of-line after each of the ``R = H/16`` rows of ``C = W/16`` image tokens; the two
  resolution tokens give height then width in 32-pixel units (``2 f`` pixels for a VQGAN with
  downsampling ``f``). Lumina-mGPT lets the model *sample* begin-of-image and the resolution
  tokens after its prompt; here they are forced (part of the prefill). String prompts are
  wrapped as Lumina-mGPT's demos do: ``"Generate an image of {W}x{H} according to the following
  prompt:\\n{prompt}"`` followed by its end-of-turn ``<reserved08706>`` (``data/convertsation.py``);
  the chat wrapping and the tokenizer's treatment of ``<reserved08706>`` are unverified on the
  real checkpoint.
* ``"anole"`` (Anole / Chameleon, facebookresearch/chameleon ``inference/chameleon.py``)::

      <s> P <racm3:break> code_0 ... code_{N-1} <eoss>

  with ``N = (resolution / f) ** 2`` (32 x 32 = 1024 for the 512 px VQGAN), no row ends. For
  string prompts ``P`` ends with the end-of-turn ``<reserved08706>``, as Anole's ``text2image.py``
  closes the text (its ``<END-OF-TURN>`` sentinel): the default template is ``"{prompt}<reserved08706>"``.

Classifier-free guidance, ONE forward over ``2B`` rows (cond rows first): the unconditional
rows hold the same ids; the attention mask hides the prompt and position ids count only the
visible tokens (as left padding does), which is exactly a separate forward over the visible
tokens alone:

* lumina: visible = ``<racm3:break>``, the two resolution tokens and everything after (BOS
  hidden too): Lumina-mGPT's ``LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor``
  runs its unconditional branch on ``input_ids[:, image_start_index:]`` from position 0.
* anole: visible = ``<s>``, ``<racm3:break>`` and everything after: Chameleon's
  ``ImageDecoder._split_inputs_for_cfg`` unconditional prompt ``[bos, begin_image]`` (its text
  and image guidance scales collapse to one scale for text-only prompts).

Prompts of different lengths in one batch are left-padded (masked). Reference sampling
(``FAMILY_DEFAULTS``, applied by the engine): Lumina-mGPT CFG 3.0, image top-k 2000,
temperature 1.0; Anole CFG 3.0 (text scale), temperature 0.7, top-p 0.9.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from transformers import ChameleonConfig, ChameleonForConditionalGeneration

from ._layout_model import DEFAULT_PROMPT_LENGTH, LayoutImageModel, LayoutPrompts
from ._transformers import (
    MemoryEstimate, RowEnds, check_checkpoint, check_sequence_length, checkpoint_tensor_names, estimate_memory,
    format_prompt, load_tokenizer, meta_parameter_count, movqgan_token_ids, resolve_dtype, token_id,
)
from .base import CodebookUnavailable, ImageTokenModel
from .chameleon_vqgan import ChameleonVQGANDecoder, load_vqgan_decoder, vqgan_files
from .defaults import FAMILY_DEFAULTS
from .quantize import load_pretrained

__all__ = [
    "ChameleonLayout", "ChameleonImageModel", "ChameleonPrompts", "LayoutPrompts", "LayoutImageModel", "LAYOUTS", "LUMINA_PROMPT_TEMPLATE", "ANOLE_PROMPT_TEMPLATE",
    "config_memory", "load_backbone", "shared_norm_shapes", "LUMINA_SIZES", "lumina_size_from_names", "lumina_pixel_size",
    "stored_tensor_names", "stores_codebook", "CODEBOOK_WEIGHT", "find_vqgan",
]

LAYOUTS = ("lumina", "anole")
BOS, PAD, BOI, EOI, NEWLINE, END_OF_TURN = "<s>", "<pad>", "<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>"
LUMINA_PROMPT_TEMPLATE = "Generate an image of {width}x{height} according to the following prompt:\n{prompt}" + END_OF_TURN
ANOLE_PROMPT_TEMPLATE = "{prompt}" + END_OF_TURN
#: the image sizes (pixels, square) Lumina-mGPT checkpoints are released at (Alpha-VLLM/Lumina-mGPT README)
LUMINA_SIZES = (512, 768, 1024)
#: a released size as its own part of a name: ``Lumina-mGPT-7B-768``, ``..._1024``, ``-768-Omni``
_SIZE_IN_NAME = re.compile(r"(?:^|[-_.])(" + "|".join(map(str, LUMINA_SIZES)) + r")(?=$|[-_.])")
#: the state-dict name of the VQ codebook inside a Chameleon checkpoint
CODEBOOK_WEIGHT = "model.vqmodel.quantize.embedding.weight"


def _own_names(name: str | os.PathLike) -> list[str]:
    """The names a path or repo id gives its checkpoint: the last component, and for a Hugging Face
    cache snapshot (``models--org--name/snapshots/<hash>``) the repo name."""
    parts = Path(str(name)).parts
    return list(parts[-1:]) + [p.split("--")[-1] for p in parts if p.startswith("models--")]


def lumina_size_from_names(*names: str | os.PathLike | None) -> int | None:
    """The square image size a Lumina-mGPT checkpoint's name says (one of :data:`LUMINA_SIZES`), or None.

    A size counts when it is a part of its own, between ``-``, ``_``, ``.`` or the ends, of the
    checkpoint's name (last path component, or the repo name of a Hugging Face cache snapshot):
    ``Alpha-VLLM/Lumina-mGPT-7B-512`` -> 512, ``Lumina-mGPT-7B-768-Omni`` -> 768; ``step1024`` does not count.

    Raises:
        ValueError: the names say two different sizes.
    """
    found = {}
    for name in names:
        if name is None or not str(name):
            continue
        for part in _own_names(name):
            for size in _SIZE_IN_NAME.findall(part):
                found.setdefault(int(size), part)
    if len(found) > 1:
        sizes = ", ".join(f"{s} ({part!r})" for s, part in sorted(found.items()))
        raise ValueError(f"the checkpoint's names say different Lumina-mGPT image sizes: {sizes}; give --image-size S "
                         f"(image_size=S in Python) with the size it was trained at")
    return next(iter(found), None)


def lumina_pixel_size(height: int | None, width: int | None, *names: str | os.PathLike | None) -> tuple[int, int]:
    """``(height, width)`` in pixels for a Lumina-mGPT checkpoint: the given sides, the rest from its name.

    Raises:
        ValueError: a side is not given and the names say no size (one line asking for
            ``--image-size``), or the names disagree.
    """
    size = lumina_size_from_names(*names)
    height, width = (size if height is None else height), (size if width is None else width)
    if height is None or width is None:
        given = list(dict.fromkeys(str(n) for n in names if n is not None and str(n)))  # each name once
        where = (f"the names {', '.join(map(repr, given))} hold" if len(given) > 1 else
                 f"the name {given[0]!r} holds" if given else "the checkpoint's name holds")
        raise ValueError(
            f"Lumina-mGPT image size unknown: {where} none of {', '.join(map(str, LUMINA_SIZES))} "
            f"(the sizes it is released at, e.g. Lumina-mGPT-7B-768) and its config.json has no size field; give "
            f"--image-size S (image_size=S in Python) with the size the checkpoint was trained at")
    return height, width


def _grid_token_name(n: int) -> str:
    """Lumina-mGPT's resolution token for ``n`` 32-pixel units (``FlexARItemProcessor.get_n_grids_token``)."""
    return f"<reserved{8800 + n:05d}>"


def resolution_token_ids(sides: tuple[int, int], unit: int, vocab: dict | None, tokenizer: Any) -> tuple[int, int]:
    """The ids of the resolution tokens of ``sides`` (pixels; ``unit`` pixels per token step), Lumina-mGPT 1.0's and 2.0's.

    Raises:
        ValueError: a side whose token the vocabulary lacks, naming the side and the largest size it has
            tokens for (rather than doubting the family, as a missing special token does).
    """
    ids = []
    for side in sides:
        try:
            ids.append(token_id(_grid_token_name(side // unit), vocab, tokenizer, f"resolution token for {side} px"))
        except ValueError:
            names = set(vocab or {}) | (set(tokenizer.get_vocab()) if tokenizer is not None else set())
            n = 0
            while _grid_token_name(n + 1) in names:
                n += 1
            if not n:
                raise
            raise ValueError(f"image side {side} px: its resolution token {_grid_token_name(side // unit)!r} is not in the "
                             f"checkpoint's vocabulary; allowed: sides up to {n * unit} px (multiples of {unit})") from None
    return tuple(ids)


def _downsampling(config: ChameleonConfig) -> int:
    """Pixels per image token along a side: ``2 ** (len(vq_config.channel_multiplier) - 1)`` (16)."""
    return 2 ** (len(config.vq_config.channel_multiplier) - 1)


@dataclass(frozen=True)
class ChameleonLayout:
    """Where the special tokens go. ``region`` = the part after the prefix (image tokens and row ends).

    Attributes:
        kind: ``"lumina"`` or ``"anole"``; rows, cols: the image grid.
        bos, pad, boi, eoi: ``<s>``, ``<pad>``, begin-of-image, end-of-image ids (by name);
        newline: end-of-line id (lumina) or None.
        resolution_tokens: ids after begin-of-image (lumina: height then width tokens; anole: none).
    """

    kind: str
    rows: int
    cols: int
    bos: int
    pad: int
    boi: int
    eoi: int
    newline: int | None
    resolution_tokens: tuple[int, ...]

    @classmethod
    def build(cls, config: ChameleonConfig, kind: str, height: int | None, width: int | None,
              tokenizer: Any = None) -> "ChameleonLayout":
        """Check the resolution and resolve the special ids by name (config vocabulary, checked against ``tokenizer``).

        ``height`` / ``width``: pixels; lumina needs both (see :func:`lumina_pixel_size` for taking
        them from the checkpoint's name), anole takes only its VQGAN resolution (None: that one).

        Raises:
            ValueError: unknown layout, unsupported or unknown (lumina) resolution, special tokens
                missing, or a Lumina-mGPT 2.0 vocabulary (``<MOVQGAN...>`` image tokens: never read as 1.0).
        """
        if kind not in LAYOUTS:
            raise ValueError(f"layout={kind!r}; allowed: {', '.join(LAYOUTS)}")
        vocab = config.vocabulary_map or {}
        if movqgan_token_ids(vocab):
            raise ValueError("a Lumina-mGPT 2.0 checkpoint (<MOVQGAN...> image tokens, MoVQGAN codes) cannot be read as "
                             f"layout {kind!r} (Lumina-mGPT 1.0 / Anole); load it with csdgen.models.load_model "
                             "(Lumina2ImageModel)")

        def tid(name, what):
            return token_id(name, vocab, tokenizer, what)

        f = _downsampling(config)
        ids = dict(bos=tid(BOS, "BOS"), pad=tid(PAD, "pad"), boi=tid(BOI, "begin-of-image"), eoi=tid(EOI, "end-of-image"))
        if kind == "anole":
            side = int(config.vq_config.resolution)
            if (height or side) != side or (width or side) != side:
                raise ValueError(f"Anole resolution {height}x{width}: allowed only {side}x{side} (its VQGAN resolution)")
            return cls("anole", side // f, side // f, newline=None, resolution_tokens=(), **ids)
        height, width = lumina_pixel_size(height, width)
        for name, value in (("height", height), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % (2 * f):
                raise ValueError(f"Lumina-mGPT {name}={value!r}: allowed positive multiples of {2 * f} pixels")
        res = resolution_token_ids((height, width), 2 * f, vocab, tokenizer)
        return cls("lumina", height // f, width // f, newline=tid(NEWLINE, "end-of-line"), resolution_tokens=res, **ids)

    @property
    def num_image_tokens(self) -> int:
        return self.rows * self.cols

    @property
    def row_ends(self) -> RowEnds:
        """The end-of-line tokens of the region (none for anole)."""
        return RowEnds(self.cols, self.newline)

    @property
    def image_length(self) -> int:
        """Positions after the prompt: begin-of-image, resolution tokens, the region, end-of-image."""
        return 1 + len(self.resolution_tokens) + self.region_length(self.num_image_tokens) + 1

    def prefix(self, prompt: Sequence[int]) -> list[int]:
        """``[BOS, *prompt, begin-of-image, *resolution_tokens]``."""
        return [self.bos, *prompt, self.boi, *self.resolution_tokens]

    def region_length(self, k: int) -> int:
        """Tokens after the prefix once image tokens ``0 .. k-1`` are in, with the row end of every complete row."""
        return self.row_ends.region_length(k)

    def is_row_end(self, i: int) -> bool:
        """Whether an end-of-line token follows image token ``i``."""
        return self.row_ends.is_row_end(i)

    def full_sequence(self, prompt: Sequence[int], image_ids: Sequence[int]) -> list[int]:
        """The whole sequence the family's decoder reads: prefix, image tokens (as vocabulary ids), row ends, end-of-image."""
        seq = self.prefix(prompt)
        for i, t in enumerate(image_ids):
            seq.append(int(t))
            if self.is_row_end(i):
                seq.append(self.newline)
        return seq + [self.eoi]

    def uncond_visible(self, prompt_length: int) -> list[bool]:
        """Which prefix tokens the unconditional rows see (see the module docstring)."""
        hidden = 1 + prompt_length if self.kind == "lumina" else prompt_length
        start = 0 if self.kind == "lumina" else 1
        n = len(self.prefix([0] * prompt_length))
        return [not (start <= j < start + hidden) for j in range(n)]


def _image_vocabulary(config: ChameleonConfig) -> torch.Tensor:
    """``[V]`` int64: vocabulary id of codebook entry ``v`` (from the ``IMGIMG...`` names).

    Raises:
        ValueError: no image tokens, or their codebook indices are not exactly ``0 .. V-1``.
    """
    from transformers.models.chameleon.modeling_chameleon import ChameleonImageVocabularyMapping

    bpe2img = ChameleonImageVocabularyMapping(config.vocabulary_map or {}).bpe2img
    if not bpe2img:
        raise ValueError("the checkpoint's vocabulary_map has no IMGIMG... image tokens")
    V = len(bpe2img)
    img2bpe = {code: bpe for bpe, code in bpe2img.items()}
    if sorted(img2bpe) != list(range(V)):
        raise ValueError(f"image token codebook indices are not 0..{V - 1}")
    return torch.tensor([img2bpe[v] for v in range(V)], dtype=torch.long)


def config_memory(config: ChameleonConfig, layout: ChameleonLayout, window: int, dtype: torch.dtype | str,
                  guided: bool = True, prompt_length: int = DEFAULT_PROMPT_LENGTH,
                  parameters: int | None = None) -> MemoryEstimate:
    """Memory of a run, from the config only (see :func:`~csdgen.models._transformers.estimate_memory`).

    Sequence = ``prompt_length`` (BOS and template included) + :attr:`ChameleonLayout.image_length`;
    fixed bytes include the copy of the image rows of ``lm_head``. ``parameters`` default:
    counted on the ``meta`` device.
    """
    size = torch.empty((), dtype=resolve_dtype(dtype)).element_size()
    V = len(_image_vocabulary(config))
    count = meta_parameter_count(ChameleonForConditionalGeneration, config) if parameters is None else parameters
    return estimate_memory(count, size, config, prompt_length + layout.image_length, V, window, guided,
                           extra_fixed=V * config.hidden_size * size, image_tokens=layout.num_image_tokens)


# -- loading, with Lumina-mGPT's shared q/k norms ------------------------------------------------

_NORM_SUFFIXES = ("self_attn.q_norm.weight", "self_attn.q_norm.bias", "self_attn.k_norm.weight", "self_attn.k_norm.bias")


def _weight_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    return files or sorted(folder.glob("pytorch_model*.bin"))


def stored_tensor_names(folder: str | os.PathLike) -> set[str]:
    """Names of the tensors a checkpoint folder's weight files hold (the ``*.index.json`` weight map, or the
    safetensors headers; a ``.bin`` file is memory-mapped, its tensors not read): :func:`checkpoint_tensor_names`."""
    return checkpoint_tensor_names(folder)


def file_tensor_names(folder: str | os.PathLike) -> set[str]:
    """Names of the tensors the weight files of ``folder`` hold (read from the files, not an index)."""
    return checkpoint_tensor_names(folder, index=False)


def stores_codebook(folder: str | os.PathLike) -> bool:
    """Whether the checkpoint's files hold the VQ codebook (:data:`CODEBOOK_WEIGHT`); Lumina-mGPT's
    fine-tuned checkpoints hold no ``model.vqmodel.*`` tensors (see the module docstring)."""
    return CODEBOOK_WEIGHT in stored_tensor_names(folder)


def _read_tensors(folder: Path, wanted) -> dict[str, Any]:
    """``{name: tensor}`` for the names ``wanted(name)`` accepts, read from the folder's weight files only for those names."""
    out = {}
    for file in _weight_files(folder):
        if file.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if wanted(name):
                        out[name] = f.get_tensor(name)
        else:
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            out.update({k: v.clone() for k, v in state.items() if wanted(k)})
            del state
    return out


def shared_norm_shapes(folder: str | os.PathLike, config: ChameleonConfig) -> dict[str, tuple[int, int]]:
    """The q/k-norm parameters stored per shard (Lumina-mGPT), ``{name: shape}``, read from the file headers.

    transformers' Chameleon holds them as ``[heads, head_dim]`` (``num_attention_heads`` for
    q_norm, ``num_key_value_heads`` for k_norm); Lumina-mGPT as ``[model_parallel_size, head_dim]``.

    Raises:
        ValueError: a shape that is neither (naming it and the two allowed).
    """
    folder = Path(folder)
    head_dim = config.hidden_size // config.num_attention_heads
    shapes = {}
    for file in _weight_files(folder):
        if file.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(file), framework="pt") as f:
                shapes.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys() if k.endswith(_NORM_SUFFIXES)})
        else:
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            shapes.update({k: tuple(v.shape) for k, v in state.items() if k.endswith(_NORM_SUFFIXES)})
            del state
    shared = {}
    for name, shape in shapes.items():
        heads = config.num_attention_heads if ".q_norm." in name else config.num_key_value_heads
        if shape == (heads, head_dim):
            continue
        if len(shape) != 2 or shape[1] != head_dim or heads % shape[0]:
            raise ValueError(f"{name} has shape {list(shape)}: allowed [{heads}, {head_dim}] (transformers) or "
                             f"[model_parallel_size, {head_dim}] with model_parallel_size dividing {heads} (Lumina-mGPT)")
        shared[name] = shape
    return shared


def load_backbone(folder: str | os.PathLike, dtype: torch.dtype = torch.float32,
                  device: str | torch.device = "cpu") -> ChameleonForConditionalGeneration:
    """A ``ChameleonForConditionalGeneration`` from a transformers or Lumina-mGPT checkpoint folder.

    Lumina-mGPT's per-shard q/k norms (:func:`shared_norm_shapes`) are loaded with
    ``ignore_mismatched_sizes`` and then set from the files, each shard's row repeated for its
    ``heads / model_parallel_size`` heads (Lumina-mGPT's ``ChameleonLayerNorm.repeat_param``);
    the other weights are read once.
    """
    from transformers.utils import logging as hf_logging

    folder = Path(folder)
    config = ChameleonConfig.from_pretrained(folder)
    shared = shared_norm_shapes(folder, config)
    if not shared:
        return load_pretrained(ChameleonForConditionalGeneration, folder, dtype=dtype, device=device)
    from .quantize import current_options

    device_map = current_options().device_map
    if isinstance(device_map, dict) and "disk" in map(str, device_map.values()):
        raise ValueError(f"--device-map: {str(folder)!r} stores its q/k norms per model-parallel shard (Lumina-mGPT's "
                         f"layout), which csdgen expands after loading; layers offloaded to 'disk' cannot take that: "
                         f"place them on 'cpu' or a GPU instead")
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the mismatch report is expected: those tensors are set below
    try:
        model = load_pretrained(ChameleonForConditionalGeneration, folder, dtype=dtype, device=device,
                                ignore_mismatched_sizes=True)
    finally:
        hf_logging.set_verbosity(level)
    with torch.no_grad():
        for name, tensor in _read_tensors(folder, shared.__contains__).items():
            param = model.get_parameter(name)
            param.copy_(tensor.to(param.dtype).repeat_interleave(param.shape[0] // tensor.shape[0], dim=0))
    return model if getattr(model, "hf_device_map", None) else model.to(device)  # placed by its device map


class ChameleonPrompts(LayoutPrompts):
    """Lumina-mGPT / Anole prompt rows from the config and the tokenizer only (usable before the weights are loaded).

    Args: see :class:`ChameleonImageModel` (``config`` instead of the backbone).
    """

    def __init__(self, config: ChameleonConfig, layout: str = "lumina", height: int | None = None, width: int | None = None,
                 tokenizer: Any = None, prompt_template: str | None = None):
        self.layout = ChameleonLayout.build(config, layout, height, width, tokenizer)
        self.config, self.tokenizer = config, tokenizer
        f = _downsampling(config)
        self.pixel_size = (self.layout.rows * f, self.layout.cols * f)
        self.prompt_template = prompt_template or (LUMINA_PROMPT_TEMPLATE if layout == "lumina" else ANOLE_PROMPT_TEMPLATE)
        format_prompt(self.prompt_template, "", 1, 1)  # refuse a bad template now
        check_sequence_length(1, self.layout.image_length, config.max_position_embeddings,
                              f"{self.pixel_size[0]}x{self.pixel_size[1]} image")


class ChameleonImageModel(LayoutImageModel, ChameleonPrompts, ImageTokenModel):
    """Lumina-mGPT / Anole text-to-image generation over a ``ChameleonForConditionalGeneration``.

    Args:
        backbone: the loaded model; layout: ``"lumina"`` or ``"anole"``; height, width: pixels.
        tokenizer: for string prompts (None: token-id prompts only).
        vqgan: a :class:`ChameleonVQGANDecoder` for :meth:`decode_images` and the codebook
            (None: no decoding).
        prompt_template: format string with ``{prompt}``, ``{width}``, ``{height}`` for string
            prompts; default :data:`LUMINA_PROMPT_TEMPLATE` for lumina,
            :data:`ANOLE_PROMPT_TEMPLATE` for anole.
        codebook_stored: whether the backbone's ``vqmodel`` codebook was loaded from the
            checkpoint (:func:`stores_codebook`); False: without ``vqgan``
            :meth:`codebook_embeddings` refuses (the table is random); None: not known (the
            backbone's is used).

    Conditions: prompt strings (template, then the tokenizer without special tokens) or lists of
    token ids (the prompt without BOS, no template applied). BOS ``<s>`` is always prepended.

    Attributes:
        defaults: the family's :class:`~csdgen.models.defaults.FamilyDefaults`.

    Raises:
        ValueError: unsupported layout/resolution, missing special tokens, sequence longer than
            ``max_position_embeddings``, or a VQGAN whose codebook or downsampling differs.
    """

    memory_function = staticmethod(config_memory)
    no_decoder = ("no VQGAN decoder: give --vqgan PATH (vqgan= in Python), Chameleon's tokenizer/ folder holding "
                  "vqgan.yaml and vqgan.ckpt")

    def __init__(self, backbone: ChameleonForConditionalGeneration, layout: str = "lumina", height: int | None = None,
                 width: int | None = None, tokenizer: Any = None, vqgan: ChameleonVQGANDecoder | None = None,
                 prompt_template: str | None = None, codebook_stored: bool | None = None):
        config = backbone.config
        ChameleonPrompts.__init__(self, config, layout, height, width, tokenizer, prompt_template)
        self.defaults = FAMILY_DEFAULTS["lumina-mgpt" if layout == "lumina" else "anole"]
        self._set_backbone(backbone, _image_vocabulary(config))  # [V] vocabulary id per codebook entry
        self.vqgan, self.codebook_stored = vqgan, codebook_stored
        if vqgan is not None:
            self._check_vqgan(vqgan, _downsampling(config))

    def _check_vqgan(self, vqgan: ChameleonVQGANDecoder, f: int) -> None:
        if vqgan.config.n_embed != self.codebook_size or vqgan.config.downsampling != f:
            where = f" ({vqgan.source})" if getattr(vqgan, "source", None) else ""
            raise ValueError(f"VQGAN{where} has n_embed={vqgan.config.n_embed}, downsampling {vqgan.config.downsampling}; "
                             f"the checkpoint needs {self.codebook_size} and {f}: give its own VQGAN (--vqgan)")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: torch.dtype | str = torch.float32,
                        device: str | torch.device = "cpu", layout: str = "lumina", height: int | None = None,
                        width: int | None = None, vqgan: str | os.PathLike | None = None,
                        prompt_template: str | None = None) -> "ChameleonImageModel":
        """Load a local Chameleon-format checkpoint (transformers or Lumina-mGPT layout), its tokenizer if present, and the VQGAN.

        Args:
            path: a directory (no hub downloads).
            height, width: pixels; lumina: default the size the folder's name says
                (:func:`lumina_pixel_size`), refused when it says none.
            vqgan: Chameleon's VQGAN, a folder or file as :func:`~csdgen.models.chameleon_vqgan.vqgan_files`
                takes; default: ``path`` or ``path/tokenizer`` when they hold both files, else no decoder.

        Raises:
            FileNotFoundError: missing directory, config or weights.
            ValueError: bad dtype, layout or resolution, unknown Lumina-mGPT size, a tokenizer that
                does not encode as its tokenizer.json (checked before the weights are read); bad VQGAN files.
        """
        folder = check_checkpoint(path, "Chameleon")
        dtype = resolve_dtype(dtype)
        if layout == "lumina":
            height, width = lumina_pixel_size(height, width, path)
        tokenizer = load_tokenizer(folder)
        ChameleonLayout.build(ChameleonConfig.from_pretrained(folder), layout, height, width, tokenizer)  # before the weights
        decoder = find_vqgan(vqgan, folder, device)
        backbone = load_backbone(folder, dtype, device)
        return cls(backbone, layout, height, width, tokenizer, decoder, prompt_template, codebook_stored=stores_codebook(folder))

    def codebook_embeddings(self) -> torch.Tensor:
        """``[V, D]`` float32 VQ codebook: the VQGAN's if loaded, else the checkpoint's ``vqmodel.quantize``.

        Raises:
            CodebookUnavailable: no VQGAN and the checkpoint's files hold no codebook
                (``codebook_stored`` False: Lumina-mGPT's fine-tuned checkpoints), whose table
                would be transformers' random initialisation.
        """
        if self.vqgan is not None:
            return self.vqgan.quantize.embedding.weight.detach().float()
        if self.codebook_stored is False:
            raise CodebookUnavailable(
                f"this checkpoint holds no {CODEBOOK_WEIGHT} (Lumina-mGPT's fine-tuning drops model.vqmodel before "
                f"saving), so its codebook would be random; GSD and LANTERN need Chameleon's VQGAN: give --vqgan PATH "
                f"(vqgan= in Python), the tokenizer/ folder holding vqgan.yaml and vqgan.ckpt")
        return self.backbone.model.vqmodel.quantize.embedding.weight.detach().float()


def find_vqgan(vqgan: str | os.PathLike | ChameleonVQGANDecoder | None, checkpoint: str | os.PathLike | None,
               device: str | torch.device = "cpu") -> ChameleonVQGANDecoder | None:
    """Chameleon's VQGAN decoder: ``vqgan`` (a decoder, or a folder / file as
    :func:`~csdgen.models.chameleon_vqgan.vqgan_files` takes) when given, else the checkpoint
    folder's or its ``tokenizer/``'s ``vqgan.yaml`` + ``vqgan.ckpt`` when they hold both, else None.

    Raises:
        ValueError: a given ``vqgan`` that is not a VQGAN folder or file, or bad VQGAN files.
    """
    if isinstance(vqgan, ChameleonVQGANDecoder):
        return vqgan.to(device)
    if vqgan is not None:
        return load_vqgan_decoder(*vqgan_files(vqgan), device=device)
    for folder in () if checkpoint is None else (checkpoint, os.path.join(checkpoint, "tokenizer")):
        pair = os.path.join(folder, "vqgan.yaml"), os.path.join(folder, "vqgan.ckpt")
        if all(os.path.isfile(f) for f in pair):
            return load_vqgan_decoder(*pair, device=device)
    return None


