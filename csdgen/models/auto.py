"""Load any supported checkpoint by its folder or Hugging Face repo id (:func:`load_model`).

Before any weight is read, :func:`load_model` finds the family (:mod:`csdgen.models.detect`), the
dtype (:mod:`csdgen.models.dtypes`), checks the image size, prompt template and special tokens
(:func:`prompts_for`: the config and tokenizer only), the prompts' length and the memory
(:mod:`csdgen.models.memory_check`); then the family's adapter reads the weights.
:func:`require_decoder` refuses a loaded model without its image decoder.

The public names of :mod:`~csdgen.models.detect`, :mod:`~csdgen.models.dtypes` and
:mod:`~csdgen.models.memory_check` (and :func:`~csdgen.models.plan.check_memory`,
:func:`~csdgen.models.defaults.family_defaults_table`) are importable from here too. A function finds
the others in its own module's namespace, so a test that replaces one patches the module whose code
calls it: ``memory_check.estimate_memory`` and ``memory_check.available_memory`` for
:func:`~csdgen.models.plan.check_memory`, ``auto.check_memory`` for :func:`load_model`.

Nothing is downloaded: a repo id must already be in the local Hugging Face cache.
Heavy imports (transformers, the adapters) happen inside the functions, so ``import csdgen``
stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ._transformers import HEADROOM, check_checkpoint
from .base import ImageTokenModel
from .defaults import family_defaults_table
from .detect import (FAMILIES, MODEL_TYPES, family_guidance, family_of, guess_layout, model_folder, model_type_named,
                     model_type_of, read_config, weights_model_type)
from .dtypes import DTYPE_CHOICES, FAMILY_GPU_DTYPES, _dtype, check_device, default_device, default_dtype, resolve_dtype
from .memory_check import (DEFAULT_PROMPT_LENGTH, MODEL_CLASSES, available_memory, estimate_memory,
                           estimate_memory_bytes, model_skeleton, quantized_weight_bytes)
from .plan import check_memory
from .sources import janus_side as _janus_size
from .sources import layout_rule, resolve_checkpoint
from .sources import size_arguments as _size
from .sources import square_side as _square

__all__ = [
    "load_model",
    "prompts_for",
    "require_decoder",
    "require_decoder_files",
    "check_tokenizer_files",
    # re-exported from csdgen.models.detect, .dtypes, .memory_check, .plan, .defaults and .sources
    "MODEL_TYPES",
    "FAMILIES",
    "resolve_checkpoint",
    "read_config",
    "model_type_of",
    "weights_model_type",
    "guess_layout",
    "layout_rule",
    "family_of",
    "family_guidance",
    "model_folder",
    "available_memory",
    "HEADROOM",
    "DEFAULT_PROMPT_LENGTH",
    "estimate_memory",
    "estimate_memory_bytes",
    "check_memory",
    "check_device",
    "default_device",
    "default_dtype",
    "resolve_dtype",
    "DTYPE_CHOICES",
    "FAMILY_GPU_DTYPES",
    "family_defaults_table",
    "MODEL_CLASSES",
    "model_skeleton",
    "quantized_weight_bytes",
]

#: model_type -> the family name check_checkpoint's messages use
_CHECK_NAMES = {"glm_image": "GLM-Image", "gemma": "Liquid"}


def require_decoder(model, name, folder: str | os.PathLike) -> None:
    """Refuse a checkpoint without its image decoder before generating (one line saying which files go where).

    Raises:
        ValueError: the model's ``vqgan`` is None (Chameleon's VQGAN, or Lumina-mGPT 2.0's MoVQGAN, not
            found), or its ``decoder_problem`` is set (GLM-Image without its diffusers pipeline).
    """
    if getattr(model, "vqgan", True) is None:
        kind = {"Lumina2ImageModel": "lumina-mgpt-2", "LiquidImageModel": "liquid"}.get(type(model).__name__, "anole")
        raise ValueError(_no_decoder(kind, name, Path(folder)))
    if getattr(model, "decoder_problem", None):  # GLM-Image without its diffusers pipeline or without diffusers
        raise ValueError(f"{str(name)!r}: {model.decoder_problem}")


def require_decoder_files(folder: str | os.PathLike, family: str, name, vqgan: Any = None) -> None:
    """:func:`require_decoder` before any weight is read: the decoder's files where the family's loader looks for
    them (the same line; a 7B checkpoint takes minutes to read). A ``vqgan`` given is checked by the loader, also
    before the weights.

    Raises:
        ValueError: no Chameleon VQGAN files (Lumina-mGPT, Anole, Liquid), no ``movqgan_270M.ckpt``
            (Lumina-mGPT 2.0), or GLM-Image's pipeline incomplete (:func:`~csdgen.models.glm_image.pipeline_problem`).
    """
    folder = Path(folder)
    if vqgan is not None:
        return
    if family in ("lumina-mgpt", "anole"):
        if not any((d / "vqgan.yaml").is_file() and (d / "vqgan.ckpt").is_file() for d in (folder, folder / "tokenizer")):
            raise ValueError(_no_decoder(family, name, folder))
    elif family == "liquid":
        from .liquid import find_vqgan

        if find_vqgan(folder) is None:
            raise ValueError(_no_decoder(family, name, folder))
    elif family == "lumina-mgpt-2":
        from .movqgan import find_movqgan

        if find_movqgan(folder) is None:
            raise ValueError(_no_decoder(family, name, folder))
    elif family == "glm-image":
        from .glm_image import GlmImageFolders, pipeline_problem

        parts = GlmImageFolders.find(folder)
        problem = pipeline_problem(parts.pipeline, processor_given=parts.processor is not None)
        if problem:
            raise ValueError(f"{str(name)!r}: {problem}")


def _no_decoder(family: str, name, folder: Path) -> str:
    """The one line saying which decoder files a checkpoint of ``family`` lacks and where they go."""
    if family == "lumina-mgpt-2":
        return (f"{str(name)!r} has no image decoder: give --vqgan PATH (movqgan_270M.ckpt, SberAI's MoVQGAN 270M, "
                f"which Lumina-mGPT 2.0 decodes with) or copy it into {str(folder)!r}, {str(folder / 'movqgan')!r} or "
                f"{str(folder / 'movqgan' / '270M')!r}")
    places = [folder, folder / "tokenizer"]
    if family == "liquid":  # where Liquid's evaluation code keeps them, looked in too
        places.insert(1, folder / "chameleon")
    return (f"{str(name)!r} has no image decoder: give --vqgan PATH (Chameleon's tokenizer/ folder holding vqgan.yaml "
            f"and vqgan.ckpt) or copy those two files into {', '.join(repr(str(p)) for p in places[:-1])} or "
            f"{str(places[-1])!r}")


def prompts_for(path: str | os.PathLike, family: str, *, height: int | None = None, width: int | None = None,
                image_size: int | None = None, prompt_template: str | None = None, negative_prompt: str | None = None,
                positive_prompt: str | None = None, vqgan_dir: str | None = None):
    """The family's prompt builder from the checkpoint's config and tokenizer only (no weights read).

    Lumina-mGPT: a side not given comes from the folder's name
    (:func:`~csdgen.models.chameleon.lumina_pixel_size`).

    Returns:
        :class:`~csdgen.models.janus.JanusPrompts`, :class:`~csdgen.models.emu3.Emu3Prompts`,
        :class:`~csdgen.models.chameleon.ChameleonPrompts`, :class:`~csdgen.models.glm_image.GlmImagePrompts`
        or :class:`~csdgen.models.liquid.LiquidPrompts`; building it checks the image size.

    Raises:
        ValueError: unsupported family or size, a bad template, missing special tokens.
    """
    height, width = _size(height, width, image_size)
    template = {} if prompt_template is None else {"prompt_template": prompt_template}
    if family == "janus":
        from transformers import JanusConfig

        from .janus import JanusPrompts, check_image_size

        check_image_size(JanusConfig.from_pretrained(path), _janus_size(height, width))
        return JanusPrompts.from_folder(path, **template)
    if family == "emu3":
        from .emu3 import Emu3Prompts

        extra = {k: v for k, v in (("negative_prompt", negative_prompt), ("positive_prompt", positive_prompt)) if v is not None}
        return Emu3Prompts.from_folder(path, height=height, width=width, **template, **extra)
    if family in ("lumina-mgpt", "anole"):
        from .chameleon import ChameleonPrompts, lumina_pixel_size

        layout = "lumina" if family == "lumina-mgpt" else "anole"
        if layout == "lumina":
            height, width = lumina_pixel_size(height, width, path)
        return ChameleonPrompts.from_folder(path, layout=layout, height=height, width=width, **template)
    if family == "lumina-mgpt-2":
        from .lumina2 import Lumina2Prompts

        return Lumina2Prompts.from_folder(path, height=height, width=width, **template)
    if family == "glm-image":
        from .glm_image import GlmImagePrompts

        return GlmImagePrompts.from_folder(path, height=height, width=width, **template)
    if family == "liquid":
        from .liquid import LiquidPrompts

        return LiquidPrompts.from_folder(path, vqgan_dir=vqgan_dir, image_size=_square(height, width, "Liquid"), **template)
    raise ValueError(f"family={family!r}; allowed: {', '.join(FAMILIES)}")


def load_model(path_or_id: Any, *, dtype: torch.dtype | str | None = None, device: str | torch.device | None = None,
               layout: str | None = None, height: int | None = None, width: int | None = None, image_size: int | None = None,
               max_memory_bytes: int | None = None, batch_size: int | None = 1, window: int | None = None,
               guided: bool = True, negative_prompt: str | None = None, vqgan: Any = None,
               prompts: list[str] | None = None, prompt_template: str | None = None,
               positive_prompt: str | None = None, processor: Any = None, quantize: str | None = None,
               device_map: Any = None, offload_folder: str | os.PathLike | None = None,
               need_decoder: bool = False) -> ImageTokenModel:
    """Load a Janus, Emu3, Chameleon-format (Lumina-mGPT / Anole), Lumina-mGPT 2.0, GLM-Image or Liquid checkpoint as an image-token model.

    Before any weight is read: the family, the image size, the prompt template and special
    tokens (from the config and tokenizer), then -- when ``prompts`` are given -- their
    length against ``max_position_embeddings``, then the memory for ``batch_size`` images
    with the real prompt length (else :data:`DEFAULT_PROMPT_LENGTH` tokens).

    Args:
        path_or_id: a local checkpoint folder, or a Hugging Face repo id already in the local
            cache; or a transformers model already loaded (``JanusForConditionalGeneration``,
            ``Emu3ForConditionalGeneration``, ``ChameleonForConditionalGeneration``), which goes to
            :func:`csdgen.models.loaded.from_model` with ``processor`` and the prompt and size
            options (no memory check: it is loaded; ``dtype`` / ``device`` do not apply).
        dtype: float32 / bfloat16 / float16, or None / ``"auto"``: the family's default on the device
            (:func:`resolve_dtype`: bfloat16 on CUDA, float32 on CPU).
        device: default :func:`default_device`.
        layout: Chameleon only, ``"lumina"`` or ``"anole"`` (default :func:`guess_layout`).
        height, width / image_size: output size in pixels (default: the family's; Lumina-mGPT:
            the size its name says, e.g. ``Lumina-mGPT-7B-512``, else refused asking for it).
        max_memory_bytes: memory budget for the check (default: what the device has free).
        batch_size, window: what the memory check assumes (batch_size None: no check; window
            default: the family's).
        negative_prompt: Emu3 only, the unconditional rows' prompt (default Emu3's documented one).
        positive_prompt: Emu3 only, appended to each prompt string (default Emu3's; ``""`` = off).
        vqgan: Chameleon and Liquid only, Chameleon's VQGAN: a folder holding ``vqgan.yaml`` + ``vqgan.ckpt``
            (its ``tokenizer/``) or the ``vqgan.ckpt`` file (CLI ``--vqgan PATH``); default: the
            checkpoint folder or its ``tokenizer/`` (Liquid: also ``chameleon/``) when they hold both, else no image decoder.
            Needed for GSD / LANTERN when the checkpoint holds no VQ codebook (Lumina-mGPT).
            Lumina-mGPT 2.0: the folder of ``movqgan_270M.ckpt`` or that file (default: the
            checkpoint folder, its ``movqgan/`` or ``movqgan/270M/``, else no image decoder).
        prompts: the prompt strings the run will use (for the length and memory checks).
        prompt_template: ``{prompt}``, ``{width}``, ``{height}`` template for prompt strings
            (default: the family's, see docs/models.md).
        processor: with an in-memory model only: its processor or tokenizer (default: loaded
            from the folder the model came from, when that is here).
        quantize: None, or ``int8`` / ``int4`` / ``fp8`` (torchao weight-only) / ``nf4`` / ``bnb8``
            (bitsandbytes): the language model's decoder layers quantised while the weights are read;
            the vision tower, VQ decoder and heads keep ``dtype`` (:mod:`csdgen.models.quantize`).
            Speculative decoding stays exact for the quantised model (it is the target).
        device_map: None, ``"auto"``, ``"balanced"``, ``"sequential"`` or a dict / JSON object of module
            -> device (``"cpu"``, ``"cuda:1"``, ``"disk"``): accelerate splits the model across devices
            (each layer's KV cache stays with its layer). ``offload_folder``: where ``"disk"`` modules go
            (default: a temporary folder).
        need_decoder: refuse, after the other checks and before the weights, a checkpoint whose image
            decoder files are not there (:func:`require_decoder_files`; what the commands that write images ask).

    Returns:
        the family's image-token model, with ``checkpoint`` (the folder it was read from, which
        :func:`csdgen.save_run` records), ``quantize`` and ``device_map`` set.

    Raises:
        FileNotFoundError: no such folder nor cached repo, or no config/weights.
        ValueError: an empty ``path_or_id`` (``""``, not the current folder); a ``device`` torch does not
            know (``"tpu"``); unsupported model type,
            layout, size, dtype or template; a prompt too long; not enough memory; a tokenizer that
            does not encode as its tokenizer.json.
        TypeError: ``path_or_id`` neither a path / repo id nor a supported transformers model.
    """
    if isinstance(prompts, str) or (prompts is not None and not all(isinstance(p, str) for p in prompts)):
        raise ValueError(f"prompts={prompts!r:.80}: allowed a list of prompt strings (the run's, for the length and "
                         f"memory checks) or None")
    if not isinstance(path_or_id, (str, os.PathLike)):
        from .loaded import from_model

        given = [name for name, value in (("dtype", None if dtype == "auto" else dtype), ("device", device), ("max_memory_bytes", max_memory_bytes),
                                          ("quantize", quantize), ("device_map", device_map)) if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: apply when loading from a folder; an in-memory model is used as it is "
                             f"(move or cast it first, e.g. model.to('cuda', torch.bfloat16))")
        model = from_model(path_or_id, processor, layout=layout, height=height, width=width, image_size=image_size,
                           vqgan=vqgan, prompt_template=prompt_template, negative_prompt=negative_prompt,
                           positive_prompt=positive_prompt)
        if prompts:
            model.check_length(model.prompt_length(list(prompts)))
        return model
    if processor is not None:
        raise ValueError("processor= applies to an in-memory model; a checkpoint folder's own tokenizer files are used")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size={batch_size!r}: allowed an integer >= 1 (the images decoded together, for the "
                         f"memory check) or None (no check)")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window={window!r}: allowed an integer >= 1 (the widest window, for the memory check) or None")
    if device is not None:
        check_device(device)  # before the folder is looked for: torch's own error lists 20 device types
    from csdgen.prompts import check_text

    for name, value in (("negative_prompt", negative_prompt), ("positive_prompt", positive_prompt),
                        ("prompt_template", prompt_template)):
        if isinstance(value, str):
            check_text(value, f"{name} =")  # text a tokenizer takes: no lone surrogates (bytes that were not UTF-8)
    folder = resolve_checkpoint(path_or_id)
    model_type = model_type_of(folder)
    if layout is not None and model_type != "chameleon":
        raise ValueError(f"layout={layout!r} applies to Chameleon checkpoints only; {str(path_or_id)!r} is {model_type_named(model_type)}")
    for name, value in (("negative_prompt", negative_prompt), ("positive_prompt", positive_prompt)):
        if value is not None and model_type != "emu3":
            raise ValueError(f"{name} applies to Emu3 checkpoints only; {str(path_or_id)!r} is {model_type_named(model_type)}")
    if vqgan is not None and model_type not in ("chameleon", "gemma"):
        raise ValueError(f"vqgan applies to Chameleon-format (Lumina-mGPT, Anole, Lumina-mGPT 2.0) and Liquid checkpoints "
                         f"only; {str(path_or_id)!r} is {model_type_named(model_type)}")
    vqgan_dir = None
    if vqgan is not None and model_type == "gemma":  # Liquid takes the folder of vqgan.yaml + vqgan.ckpt
        vqgan_dir = Path(vqgan).parent if Path(vqgan).is_file() else Path(vqgan)
    family = family_of(folder, layout, str(path_or_id))
    device = device or default_device()
    dtype = _dtype(dtype, device, family)
    from .quantize import check_quantize, load_options, parse_device_map

    check_quantize(quantize, device)  # before any weight is read
    device_map = parse_device_map(device_map)
    check_checkpoint(model_folder(folder), "Lumina-mGPT 2.0" if family == "lumina-mgpt-2"
                     else _CHECK_NAMES.get(model_type, model_type.capitalize()))
    if vqgan is not None and family == "lumina-mgpt-2":  # the folder of movqgan_270M.ckpt
        vqgan_dir = Path(vqgan).parent if Path(vqgan).is_file() else Path(vqgan)
    if family == "lumina-mgpt":
        from .chameleon import lumina_pixel_size

        height, width = lumina_pixel_size(*_size(height, width, image_size), str(path_or_id), folder)
        image_size = None
    if prompts and any(isinstance(p, str) for p in prompts):
        check_tokenizer_files(folder, family)
    builder = prompts_for(folder, family, height=height, width=width, image_size=image_size, prompt_template=prompt_template,
                          negative_prompt=negative_prompt, positive_prompt=positive_prompt, vqgan_dir=vqgan_dir)
    prompt_length = None
    if prompts:
        prompt_length = builder.prompt_length(list(prompts))
        builder.check_length(prompt_length)
    if batch_size is not None:
        from .defaults import FAMILY_DEFAULTS

        check_memory(folder, family, batch_size, window or FAMILY_DEFAULTS[family].window, dtype, device=device,
                     height=height, width=width, image_size=image_size, guided=guided, max_memory_bytes=max_memory_bytes,
                     prompt_length=prompt_length, vqgan_dir=vqgan_dir, quantize=quantize,
                     split=device_map is not None)
    if need_decoder:
        require_decoder_files(folder, family, path_or_id, vqgan)
    height, width = _size(height, width, image_size)
    with load_options(quantize, device_map, offload_folder):
        model = _load_family(family, folder, dtype, device, height, width, layout, vqgan, vqgan_dir, prompt_template,
                             negative_prompt, positive_prompt)
    model.quantize = quantize  # what csdgen generate's first line and csdgen plan report
    model.checkpoint = str(folder)  # what csdgen.save_run records, so a folder of another checkpoint is refused
    model.device_map = next((m.hf_device_map for m in vars(model).values() if getattr(m, "hf_device_map", None)),
                            None) if device_map is not None else None
    return model


def check_tokenizer_files(folder: Path, family: str) -> None:
    """Text prompts need the checkpoint's tokenizer: refuse a folder without its files in one line naming the folder.

    Raises:
        FileNotFoundError: no tokenizer file where the family keeps it (GLM-Image: ``processor/``).
    """
    from ._transformers import TOKENIZER_FILES

    folder = Path(folder)
    places = [folder]  # where the adapter looks for it
    if family == "glm-image":
        places = [folder / "processor"] if (folder / "model_index.json").is_file() else [folder, folder.parent / "processor"]
    if not any((where / name).is_file() for where in places for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"{' or '.join(repr(str(p)) for p in places)}: no tokenizer ({', '.join(TOKENIZER_FILES)}); "
                                f"text prompts need the checkpoint's tokenizer: copy its tokenizer files there")


def _load_family(family, folder, dtype, device, height, width, layout, vqgan, vqgan_dir, prompt_template,
                 negative_prompt, positive_prompt) -> ImageTokenModel:
    """The family's adapter ``from_pretrained`` (after :func:`load_model`'s checks)."""
    template = {} if prompt_template is None else {"prompt_template": prompt_template}
    if family == "janus":
        from .janus import JanusImageModel

        return JanusImageModel.from_pretrained(folder, dtype=dtype, device=device, image_size=_janus_size(height, width),
                                               **template)
    if family == "emu3":
        from .emu3 import Emu3ImageModel

        extra = {k: v for k, v in (("negative_prompt", negative_prompt), ("positive_prompt", positive_prompt)) if v is not None}
        return Emu3ImageModel.from_pretrained(folder, dtype=dtype, device=device, height=height, width=width, **template, **extra)
    if family == "lumina-mgpt-2":
        from .lumina2 import Lumina2ImageModel

        return Lumina2ImageModel.from_pretrained(folder, dtype=dtype, device=device, height=height, width=width,
                                                 vqgan_dir=vqgan_dir, prompt_template=prompt_template)
    if family == "glm-image":
        from .glm_image import GlmImageModel

        return GlmImageModel.from_pretrained(folder, dtype=dtype, device=device, height=height, width=width, **template)
    if family == "liquid":
        from .liquid import LiquidImageModel

        return LiquidImageModel.from_pretrained(folder, dtype=dtype, device=device, vqgan_dir=vqgan_dir,
                                                image_size=_square(height, width, "Liquid"), **template)
    from .chameleon import ChameleonImageModel

    kind = "lumina" if family == "lumina-mgpt" else "anole"
    return ChameleonImageModel.from_pretrained(str(folder), dtype=dtype, device=device, layout=kind, height=height, width=width,
                                               vqgan=vqgan, prompt_template=prompt_template)


