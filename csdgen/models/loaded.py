"""An already-loaded transformers model (a notebook's Janus, Emu3 or Chameleon model) as an image-token model.

:func:`from_model` takes the object a user got from ``JanusForConditionalGeneration``,
``Emu3ForConditionalGeneration`` or ``ChameleonForConditionalGeneration.from_pretrained`` (Lumina-mGPT
and Anole are Chameleon-format) and builds the family's adapter around it, as
:func:`csdgen.models.load_model` does from a folder:

* the family from the model's class; the special ids from its config (Chameleon's and Emu3's
  ``vocabulary_map``), its generation config (Janus) and the processor / tokenizer by name, with
  the same checks as from a folder (Janus's pad token against ``generation_config.pad_token_id``);
* what only the checkpoint's files say is read from the folder the model was loaded from
  (``model.name_or_path``: a local folder, or a repo id already in the Hugging Face cache; nothing
  is downloaded) when it is here: the tokenizer when none is given, the tokenizer.json the given
  tokenizer must encode as (:func:`~csdgen.models._transformers.check_tokenizer`), whether the
  files hold the VQ codebook (Lumina-mGPT's do not), Lumina-mGPT's per-shard q/k norms (which
  transformers' loader cannot read: an in-memory copy that differs from them is refused), the
  VQGAN files beside it. Lumina-mGPT's image size comes from the name as for a folder.

Nothing is moved or cast: the adapter runs where the model is, in its dtype.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch

from .base import ImageTokenModel

__all__ = ["from_model", "source_folder"]

_CLASSES = ("JanusForConditionalGeneration", "Emu3ForConditionalGeneration", "ChameleonForConditionalGeneration")


def source_folder(model: Any, name: str | os.PathLike | None = None) -> Path | None:
    """The checkpoint folder ``model`` was loaded from (``name``, default ``model.name_or_path``):
    an existing folder, or a repo id found in the local Hugging Face cache; None otherwise."""
    from .sources import resolve_checkpoint

    source = str(name if name is not None else getattr(model, "name_or_path", "") or "")
    if not source:
        return None
    folder = Path(source).expanduser()
    if folder.is_dir():
        return folder
    try:
        return resolve_checkpoint(source)
    except (FileNotFoundError, ValueError, OSError):
        return None


def _family(model: Any) -> str:
    import transformers

    for cls, family in zip(_CLASSES, ("janus", "emu3", "chameleon")):
        if isinstance(model, getattr(transformers, cls)):
            return family
    allowed = f"allowed: a loaded transformers {', '.join(_CLASSES)} (Lumina-mGPT and Anole load as Chameleon)"
    if isinstance(model, transformers.PreTrainedModel):
        raise TypeError(f"a {type(model).__name__} (model_type {getattr(model.config, 'model_type', None)!r}) is not an "
                        f"image-generation model csdgen drives; {allowed}")
    raise TypeError(f"got {type(model).__name__}, not a loaded model nor a checkpoint folder; {allowed}, or a folder / repo id")


def _tokenizer(processor: Any) -> Any:
    return getattr(processor, "tokenizer", processor)


def _check_lumina_norms(model: Any, folder: Path) -> None:
    """Refuse an in-memory model whose q/k norms differ from Lumina-mGPT's per-shard rows in ``folder``."""
    from .chameleon import _read_tensors, shared_norm_shapes

    shared = shared_norm_shapes(folder, model.config)
    for name, tensor in _read_tensors(folder, shared.__contains__).items():
        param = model.get_parameter(name)
        expected = tensor.to(param.device, param.dtype).repeat_interleave(param.shape[0] // tensor.shape[0], dim=0)
        if not torch.equal(param.detach(), expected):
            raise ValueError(
                f"the in-memory model's {name} differs from {str(folder)!r}, which stores it per shard "
                f"({list(tensor.shape)}, Lumina-mGPT's layout, that transformers' loader cannot read: "
                f"ignore_mismatched_sizes leaves those norms random); load it with csdgen.models.load_model({str(folder)!r})")


def from_model(model: Any, processor: Any = None, *, layout: str | None = None, height: int | None = None,
               width: int | None = None, image_size: int | None = None, vqgan: Any = None,
               prompt_template: str | None = None, negative_prompt: str | None = None,
               positive_prompt: str | None = None, name: str | os.PathLike | None = None) -> ImageTokenModel:
    """The family adapter around an in-memory transformers model (see the module docstring).

    Args:
        model: a loaded ``JanusForConditionalGeneration``, ``Emu3ForConditionalGeneration`` or
            ``ChameleonForConditionalGeneration`` (Lumina-mGPT, Anole), on any device and dtype.
        processor: Janus: its ``JanusProcessor``; Emu3 / Chameleon: the processor or its
            tokenizer; None: loaded from the source folder when it is here, else token-id prompts only.
        layout: Chameleon only, ``"lumina"`` or ``"anole"`` (default: the rule of
            :func:`~csdgen.models.detect.guess_layout` on the config's ``architectures`` and the name).
        height, width / image_size: pixels, as for :func:`~csdgen.models.auto.load_model`.
        vqgan: Chameleon only, Chameleon's VQGAN (a ``ChameleonVQGANDecoder``, a folder or the
            ``vqgan.ckpt`` file); default: the source folder's, if it holds one.
        prompt_template, negative_prompt, positive_prompt: as for :func:`~csdgen.models.auto.load_model`.
        name: where the model came from (a folder or repo id), default ``model.name_or_path``.

    Raises:
        TypeError: not one of the three model classes.
        ValueError: an option of another family, a bad size or template, special tokens not found
            or disagreeing, a tokenizer that does not encode as the source folder's tokenizer.json,
            Lumina-mGPT q/k norms that differ from the source files, an unknown Lumina-mGPT size.

    Warns:
        UserWarning: a Chameleon model whose source folder is not here and no VQGAN given: whether
            its VQ codebook was loaded cannot be checked.
    """
    from ._transformers import check_tokenizer, load_tokenizer
    from .sources import janus_side, layout_rule, size_arguments

    family = _family(model)
    for option, value, applies in (("layout", layout, "chameleon"), ("vqgan", vqgan, "chameleon"),
                                   ("negative_prompt", negative_prompt, "emu3"), ("positive_prompt", positive_prompt, "emu3")):
        if value is not None and family != applies:
            raise ValueError(f"{option} applies to {applies.capitalize()} models only; this model is {family}")
    folder = source_folder(model, name)
    source = name if name is not None else getattr(model, "name_or_path", None)
    height, width = size_arguments(height, width, image_size)
    template = {} if prompt_template is None else {"prompt_template": prompt_template}
    if processor is not None:
        check_tokenizer(_tokenizer(processor), folder)
    if family == "janus":
        from transformers import JanusProcessor

        from .janus import JanusImageModel, check_image_size, special_ids

        if processor is None and folder is not None:
            processor = load_tokenizer(folder, JanusProcessor)
        if processor is not None and not isinstance(processor, JanusProcessor):
            raise ValueError(f"processor: Janus needs its JanusProcessor (JanusProcessor.from_pretrained(folder)), which builds "
                             f"the image-generation prompt; got {type(processor).__name__}")
        check_image_size(model.config, janus_side(height, width))
        gen = getattr(model, "generation_config", None)
        gen = None if gen is None or getattr(gen, "_from_model_config", False) else gen  # derived from config.json: not the file
        return JanusImageModel(model, *special_ids(folder, processor, generation_config=gen), processor=processor, **template)
    tokenizer = _tokenizer(processor) if processor is not None else load_tokenizer(folder) if folder is not None else None
    if family == "emu3":
        from .emu3 import Emu3ImageModel

        extra = {k: v for k, v in (("negative_prompt", negative_prompt), ("positive_prompt", positive_prompt)) if v is not None}
        return Emu3ImageModel(model, tokenizer, height, width, **template, **extra)
    from .chameleon import LAYOUTS, ChameleonImageModel, find_vqgan, lumina_pixel_size, stores_codebook

    kind = layout or layout_rule(getattr(model.config, "architectures", None), source, folder.name if folder else None)
    if kind not in LAYOUTS:
        raise ValueError(f"layout={kind!r}; allowed: {', '.join(LAYOUTS)}")
    if kind == "lumina":
        height, width = lumina_pixel_size(height, width, source, folder)
    device = next(model.parameters()).device
    decoder = find_vqgan(vqgan, folder, device)
    stored = None
    if folder is not None and (any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))):
        stored = stores_codebook(folder)
        _check_lumina_norms(model, folder)
    elif decoder is None:
        warnings.warn(f"the Chameleon model's checkpoint folder ({source!r}) is not here: whether its VQ codebook was loaded "
                      f"cannot be checked (Lumina-mGPT's files hold none), so GSD and LANTERN use it as it is; pass "
                      f"vqgan= (Chameleon's tokenizer/ folder) to use the VQGAN's", stacklevel=2)
    return ChameleonImageModel(model, kind, height, width, tokenizer, decoder, prompt_template, codebook_stored=stored)
