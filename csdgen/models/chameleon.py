"""Chameleon-format text-to-image models: Lumina-mGPT and Anole, on transformers' Chameleon.

transformers' ``ChameleonForConditionalGeneration.forward`` sets every image-token logit to
the dtype minimum, so this adapter runs ``model.model(...)`` (the decoder stack, with its KV
cache) and applies the ``lm_head`` rows of the image tokens itself. Image tokens are the
vocabulary entries named ``IMGIMG...`` (``config.vocabulary_map``); their codebook index comes
from transformers' ``ChameleonImageVocabularyMapping.bpe2img``; column ``v`` of the returned
logits is codebook entry ``v``. Nothing is hard-coded by id: special tokens are looked up by name.

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

  with ``N = (resolution / f) ** 2`` (32 x 32 = 1024 for the 512 px VQGAN), no row ends.

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

Prompts of different lengths in one batch are left-padded (masked). Reference sampling, for
the engine to apply (not done here): Lumina-mGPT CFG 3.0, image top-k 2000, temperature 1.0;
Chameleon/Anole CFG 3.0 (text scale), temperature 0.7, top-p 0.9.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, ChameleonConfig, ChameleonForConditionalGeneration, DynamicCache

from ._transformers import CachedSession, kv_cache_bytes, left_pad, meta_parameter_count
from .base import ImageTokenModel, WindowLogits
from .chameleon_vqgan import ChameleonVQGANDecoder, load_vqgan_decoder

__all__ = ["ChameleonLayout", "ChameleonImageModel", "LAYOUTS", "LUMINA_PROMPT_TEMPLATE", "estimate_memory"]

LAYOUTS = ("lumina", "anole")
BOI, EOI, NEWLINE = "<racm3:break>", "<eoss>", "<reserved08799>"
LUMINA_PROMPT_TEMPLATE = "Generate an image of {width}x{height} according to the following prompt:\n{prompt}<reserved08706>"


def _grid_token_name(n: int) -> str:
    """Lumina-mGPT's resolution token for ``n`` 32-pixel units (``FlexARItemProcessor.get_n_grids_token``)."""
    return f"<reserved{8800 + n:05d}>"


def _downsampling(config: ChameleonConfig) -> int:
    """Pixels per image token along a side: ``2 ** (len(vq_config.channel_multiplier) - 1)`` (16)."""
    return 2 ** (len(config.vq_config.channel_multiplier) - 1)


def _name_id(config: ChameleonConfig, name: str, what: str) -> int:
    vocab = config.vocabulary_map or {}
    if name not in vocab:
        raise ValueError(f"the checkpoint's vocabulary_map has no {name!r} ({what}); not a Chameleon-format checkpoint?")
    return int(vocab[name])


@dataclass(frozen=True)
class ChameleonLayout:
    """Where the special tokens go. ``region`` = the part after the prefix (image tokens and row ends).

    Attributes:
        kind: ``"lumina"`` or ``"anole"``; rows, cols: the image grid.
        bos, boi, eoi: BOS, begin-of-image, end-of-image ids; newline: end-of-line id (lumina) or None.
        resolution_tokens: ids after begin-of-image (lumina: height then width tokens; anole: none).
    """

    kind: str
    rows: int
    cols: int
    bos: int
    boi: int
    eoi: int
    newline: int | None
    resolution_tokens: tuple[int, ...]

    @classmethod
    def build(cls, config: ChameleonConfig, kind: str, height: int | None, width: int | None) -> "ChameleonLayout":
        """Check the resolution and resolve the special ids by name.

        Raises:
            ValueError: unknown layout, unsupported resolution, or special tokens missing.
        """
        if kind not in LAYOUTS:
            raise ValueError(f"layout={kind!r}; allowed: {', '.join(LAYOUTS)}")
        f = _downsampling(config)
        ids = dict(bos=int(config.bos_token_id), boi=_name_id(config, BOI, "begin-of-image"), eoi=_name_id(config, EOI, "end-of-image"))
        if kind == "anole":
            side = int(config.vq_config.resolution)
            if (height or side) != side or (width or side) != side:
                raise ValueError(f"Anole resolution {height}x{width}: allowed only {side}x{side} (its VQGAN resolution)")
            return cls("anole", side // f, side // f, newline=None, resolution_tokens=(), **ids)
        height, width = height or 768, width or 768
        for name, value in (("height", height), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % (2 * f):
                raise ValueError(f"Lumina-mGPT {name}={value!r}: allowed positive multiples of {2 * f} pixels")
        res = tuple(_name_id(config, _grid_token_name(v // (2 * f)), f"resolution token for {v} px") for v in (height, width))
        return cls("lumina", height // f, width // f, newline=_name_id(config, NEWLINE, "end-of-line"), resolution_tokens=res, **ids)

    @property
    def num_image_tokens(self) -> int:
        return self.rows * self.cols

    def prefix(self, prompt: Sequence[int]) -> list[int]:
        """``[BOS, *prompt, begin-of-image, *resolution_tokens]``."""
        return [self.bos, *prompt, self.boi, *self.resolution_tokens]

    def region_length(self, k: int) -> int:
        """Tokens after the prefix once image tokens ``0 .. k-1`` are in, with the row end of every complete row."""
        return k + (k // self.cols if self.newline is not None else 0)

    def is_row_end(self, i: int) -> bool:
        """Whether an end-of-line token follows image token ``i``."""
        return self.newline is not None and i % self.cols == self.cols - 1

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


def estimate_memory(config: ChameleonConfig, layout: ChameleonLayout, batch_size: int, window: int, dtype: torch.dtype,
                    guided: bool = True, prompt_tokens: int = 128) -> int:
    """Bytes needed before loading: parameters + image head copy + KV cache + logits/probability buffers.

    KV cache: ``2 * layers * rows * seq * kv_heads * head_dim`` elements of ``dtype``, rows = 2B
    when guided, seq = prefix (``prompt_tokens`` + specials) + image region + end-of-image.
    Buffers: ``[rows, W, V]`` float32 logits plus 3 ``[B, W, V]`` float32 (q, p, residual).
    Activations of one forward are not counted (small next to the cache for W <= 64).
    """
    size = torch.empty((), dtype=dtype).element_size()
    rows = 2 * batch_size if guided else batch_size
    seq = prompt_tokens + len(layout.prefix([])) + layout.region_length(layout.num_image_tokens) + 1
    kv = kv_cache_bytes(config, rows, seq, size)
    V = len(_image_vocabulary(config))
    buffers = (rows + 3 * batch_size) * window * V * 4
    return meta_parameter_count(ChameleonForConditionalGeneration, config) * size + V * config.hidden_size * size + kv + buffers


class ChameleonImageModel(ImageTokenModel):
    """Lumina-mGPT / Anole text-to-image generation over a ``ChameleonForConditionalGeneration``.

    Args:
        backbone: the loaded model; layout: ``"lumina"`` or ``"anole"``; height, width: pixels.
        tokenizer: for string prompts (None: token-id prompts only).
        vqgan: a :class:`ChameleonVQGANDecoder` for :meth:`decode_images` (None: no decoding).
        prompt_template: format string with ``{prompt}``, ``{width}``, ``{height}`` for string
            prompts; default :data:`LUMINA_PROMPT_TEMPLATE` for lumina, ``"{prompt}"`` for anole.

    Conditions: prompt strings (template, then the tokenizer without special tokens) or lists of
    token ids (the prompt without BOS, no template applied). BOS is always prepended.

    Raises:
        ValueError: unsupported layout/resolution, missing special tokens, sequence longer than
            ``max_position_embeddings``, or a VQGAN whose codebook or downsampling differs.
    """

    def __init__(self, backbone: ChameleonForConditionalGeneration, layout: str = "lumina", height: int | None = None,
                 width: int | None = None, tokenizer: Any = None, vqgan: ChameleonVQGANDecoder | None = None,
                 prompt_template: str | None = None):
        config = backbone.config
        self.layout = ChameleonLayout.build(config, layout, height, width)
        self.backbone, self.tokenizer, self.vqgan = backbone.eval(), tokenizer, vqgan
        self.device = next(backbone.parameters()).device
        self.image_ids = _image_vocabulary(config).to(self.device)  # [V] vocabulary id per codebook entry
        self.codebook_size = len(self.image_ids)
        self.grid = (self.layout.rows, self.layout.cols)
        self.num_image_tokens = self.layout.num_image_tokens
        self.pixel_size = (self.layout.rows * _downsampling(config), self.layout.cols * _downsampling(config))
        self.prompt_template = prompt_template or (LUMINA_PROMPT_TEMPLATE if layout == "lumina" else "{prompt}")
        with torch.no_grad():
            self.image_head = backbone.lm_head.weight[self.image_ids].detach()  # [V, hidden]
        needed = len(self.layout.prefix([])) + self.layout.region_length(self.num_image_tokens) + 1
        if needed > config.max_position_embeddings:
            raise ValueError(f"{self.pixel_size[0]}x{self.pixel_size[1]} needs {needed} positions > max_position_embeddings={config.max_position_embeddings}")
        if vqgan is not None:
            self._check_vqgan(vqgan, _downsampling(config))

    def _check_vqgan(self, vqgan: ChameleonVQGANDecoder, f: int) -> None:
        if vqgan.config.n_embed != self.codebook_size or vqgan.config.downsampling != f:
            raise ValueError(f"VQGAN has n_embed={vqgan.config.n_embed}, downsampling {vqgan.config.downsampling}; "
                             f"the checkpoint needs {self.codebook_size} and {f}")

    @classmethod
    def from_pretrained(cls, path: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                        layout: str = "lumina", height: int | None = None, width: int | None = None,
                        vqgan_dir: str | None = None, prompt_template: str | None = None) -> "ChameleonImageModel":
        """Load a local Chameleon-format checkpoint (config.json + weights), its tokenizer if present, and the VQGAN.

        Args:
            path: a directory (no hub downloads).
            vqgan_dir: directory with ``vqgan.yaml`` + ``vqgan.ckpt``; default: ``path`` or
                ``path/tokenizer`` when they hold both, else no decoder.

        Raises:
            ValueError: missing directory, config or weights; bad layout or resolution; bad VQGAN files.
        """
        if not os.path.isdir(path):
            raise ValueError(f"checkpoint path {path!r} is not a directory")
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"{path!r} has no config.json; expected a Chameleon-format (transformers) checkpoint")
        if not glob.glob(os.path.join(path, "*.safetensors")) + glob.glob(os.path.join(path, "*.bin")):
            raise ValueError(f"{path!r} has no weights (*.safetensors or *.bin)")
        ChameleonLayout.build(ChameleonConfig.from_pretrained(path), layout, height, width)  # fail before loading weights
        backbone = ChameleonForConditionalGeneration.from_pretrained(path, dtype=dtype).to(device)
        return cls(backbone, layout, height, width, _load_tokenizer(path), _find_vqgan(path, vqgan_dir, device), prompt_template)

    def memory_estimate(self, batch_size: int, window: int, dtype: torch.dtype, guided: bool = True) -> int:
        """Bytes for this model, see :func:`estimate_memory` (prompt budget 128 tokens)."""
        return estimate_memory(self.backbone.config, self.layout, batch_size, window, dtype, guided)

    def prompt_ids(self, conditions: Sequence[str | Sequence[int]]) -> list[list[int]]:
        """Token ids of each prompt (without BOS).

        Raises:
            ValueError: empty list, a string with no tokenizer, or ids outside the vocabulary.
        """
        if isinstance(conditions, str) or not len(conditions):
            raise ValueError("conditions must be a non-empty list of prompt strings or token-id lists")
        vocab = self.backbone.config.vocab_size
        out = []
        for c in conditions:
            if isinstance(c, str):
                if self.tokenizer is None:
                    raise ValueError("string prompts need a tokenizer in the checkpoint directory; pass token-id lists instead")
                h, w = self.pixel_size
                c = self.tokenizer(self.prompt_template.format(prompt=c, width=w, height=h), add_special_tokens=False)["input_ids"]
            ids = [int(t) for t in c]
            if any(not 0 <= t < vocab for t in ids):
                raise ValueError(f"prompt token ids must be in 0..{vocab - 1}")
            out.append(ids)
        return out

    def start(self, conditions, batch_size, guided):
        prompts = [[] for _ in range(batch_size or 1)] if conditions is None else self.prompt_ids(conditions)
        if batch_size is not None and batch_size != len(prompts):
            raise ValueError(f"batch_size={batch_size} differs from the {len(prompts)} conditions given")
        return _ChameleonSession(self, prompts, guided)

    def codebook_embeddings(self) -> torch.Tensor:
        """``[V, D]`` float32 VQ codebook: the VQGAN's if loaded, else the checkpoint's ``vqmodel.quantize``."""
        source = self.vqgan.quantize.embedding if self.vqgan is not None else self.backbone.model.vqmodel.quantize.embedding
        return source.weight.detach().float()

    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens ``[B, N]`` int64 -> ``[B, 3, rows*f, cols*f]`` float32 in [-1, 1] (f = 16 for the real VQGAN).

        Raises:
            NotImplementedError: no VQGAN was loaded. ValueError: wrong shape.
        """
        if self.vqgan is None:
            raise NotImplementedError("no VQGAN decoder: give vqgan_dir= with Chameleon's vqgan.yaml and vqgan.ckpt")
        if tokens.ndim != 2 or tokens.shape[1] != self.num_image_tokens:
            raise ValueError(f"tokens of shape {tuple(tokens.shape)}: expected [B, {self.num_image_tokens}]")
        with torch.no_grad():
            return self.vqgan.decode(tokens.reshape(-1, *self.grid))


def _load_tokenizer(path: str):
    names = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
    if not any(os.path.isfile(os.path.join(path, n)) for n in names):
        return None
    return AutoTokenizer.from_pretrained(path)


def _find_vqgan(path: str, vqgan_dir: str | None, device) -> ChameleonVQGANDecoder | None:
    candidates = [vqgan_dir] if vqgan_dir is not None else [path, os.path.join(path, "tokenizer")]
    for d in candidates:
        yaml_path, ckpt_path = os.path.join(d, "vqgan.yaml"), os.path.join(d, "vqgan.ckpt")
        if vqgan_dir is not None or (os.path.isfile(yaml_path) and os.path.isfile(ckpt_path)):
            return load_vqgan_decoder(yaml_path, ckpt_path, device=device)
    return None


class _ChameleonSession(CachedSession):
    """KV-cached session over ``[cond rows; uncond rows]`` sharing ids; see the module docstring."""

    def __init__(self, model: ChameleonImageModel, prompts: list[list[int]], guided: bool):
        self.model, self.layout, self.batch_size, self.guided = model, model.layout, len(prompts), guided
        prefixes = [self.layout.prefix(p) for p in prompts]
        P = self.prefix_length = max(len(p) for p in prefixes)
        pad = model.backbone.config.pad_token_id or 0
        ids, mask = left_pad(prefixes, pad)
        if guided:
            uncond = [[0] * (P - len(p)) + [int(v) for v in self.layout.uncond_visible(len(q))] for p, q in zip(prefixes, prompts)]
            ids, mask = torch.cat([ids, ids]), torch.cat([mask, torch.tensor(uncond)])
        dev = model.device
        self.prefix_ids, self.prefix_mask = ids.to(dev), mask.to(dev)
        self.prefix_positions = (mask.cumsum(1) - 1).clamp(min=0).to(dev)
        self.base = mask.sum(1).to(dev)[:, None]  # position id of the first region token, per row
        self.cache = DynamicCache(config=model.backbone.config)
        self.sequence = self.prefix_ids  # [rows, seq] ids in the cache (for tests and inspection)
        self._length = -1

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, out_index: list[int]) -> WindowLogits:
        total = self.sequence.shape[1]
        region = total - self.prefix_length
        mask = torch.cat([self.prefix_mask, self.prefix_mask.new_ones(self.prefix_mask.shape[0], region)], dim=1)
        with torch.no_grad():
            hidden = self.model.backbone.model(
                input_ids=ids, attention_mask=mask, position_ids=positions, cache=self.cache, use_cache=True
            ).last_hidden_state
            logits = F.linear(hidden[:, out_index], self.model.image_head).float()  # [rows, W, V]
        return self._window_logits(logits)

    def prefill(self) -> WindowLogits:
        if self._length != -1:
            raise ValueError("prefill runs once per session")
        logits = self._run(self.prefix_ids, self.prefix_positions, [self.prefix_length - 1])
        self._length = 0
        return logits

    def forward(self, tokens, start):
        if start != self._length or self._length < 0:
            raise ValueError(f"start={start} but the session holds {self._length} image positions (prefill first)")
        rows = self.prefix_ids.shape[0]
        vocab_ids = self.model.image_ids[tokens.to(self.model.device)]  # [B, W]
        if self.guided:
            vocab_ids = torch.cat([vocab_ids, vocab_ids])
        columns, out_index = [], []
        for j in range(tokens.shape[1]):
            columns.append(vocab_ids[:, j])
            if self.layout.is_row_end(start + j):  # forced end-of-line; its output predicts the next row's first token
                columns.append(torch.full((rows,), self.layout.newline, device=vocab_ids.device))
            out_index.append(len(columns) - 1)
        ids = torch.stack(columns, dim=1)
        offset = self.layout.region_length(start)
        positions = self.base + offset + torch.arange(ids.shape[1], device=ids.device)
        self.sequence = torch.cat([self.sequence, ids], dim=1)
        logits = self._run(ids, positions, out_index)
        self._length = start + tokens.shape[1]
        return logits

    def sequence_length(self, image_length: int) -> int:
        """Cached sequence length (prefix padding included) holding ``image_length`` image positions."""
        return self.prefix_length + self.layout.region_length(image_length)

    def rollback(self, length):
        super().rollback(length)
        self.sequence = self.sequence[:, : self.sequence_length(length)]
