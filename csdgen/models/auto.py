"""Load any supported checkpoint by its folder or Hugging Face repo id: family detection, memory check.

The family comes from ``config.json``'s ``model_type``:

* ``janus`` -> :class:`~csdgen.models.janus.JanusImageModel` (defaults ``FAMILY_DEFAULTS["janus"]``);
* ``emu3`` -> :class:`~csdgen.models.emu3.Emu3ImageModel` (``"emu3"``);
* ``chameleon`` -> :class:`~csdgen.models.chameleon.ChameleonImageModel`, layout ``"lumina"``
  (defaults ``"lumina-mgpt"``) or ``"anole"`` (``"anole"``); or, when the vocabulary holds
  ``<MOVQGAN...>`` image tokens, :class:`~csdgen.models.lumina2.Lumina2ImageModel`
  (``"lumina-mgpt-2"``): Lumina-mGPT 2.0 also says ``chameleon`` and ``ChameleonXLLMX...``, but its
  image tokens are MoVQGAN codes, so it is never read as Lumina-mGPT 1.0 (no ``layout`` applies);
* ``glm_image`` -> :class:`~csdgen.models.glm_image.GlmImageModel` (``"glm-image"``): the folder is
  GLM-Image's diffusers pipeline (``model_index.json``; the AR model's config is
  ``vision_language_encoder/config.json``) or that AR-model folder itself;
* ``gemma`` -> :class:`~csdgen.models.liquid.LiquidImageModel` (``"liquid"``): a Gemma whose
  vocabulary holds image rows past its tokenizer's (a plain Gemma is refused by the adapter).

Chameleon layout rule when none is given (:func:`guess_layout`): ``"lumina"`` if
``config.json``'s ``architectures`` holds Lumina-mGPT's own class
(``ChameleonXLLMXForConditionalGeneration``); else ``"anole"`` if the name the user gave (repo
id or path) or the folder's name contains ``anole`` (any case) and not ``lumina``; otherwise
``"lumina"``. Both share the Chameleon vocabulary, so nothing else in the config tells them
apart; pass ``layout`` to be sure.

Nothing is downloaded: a repo id must already be in the local Hugging Face cache.
Heavy imports (transformers, the adapters) happen inside the functions, so ``import csdgen``
stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ._transformers import DTYPES as _DTYPES
from ._transformers import HEADROOM, MemoryEstimate, check_checkpoint, meta_parameter_count, movqgan_token_ids
from .base import ImageTokenModel
from .sources import janus_side as _janus_size
from .sources import layout_rule, resolve_checkpoint
from .sources import size_arguments as _size

__all__ = [
    "MODEL_TYPES",
    "FAMILIES",
    "resolve_checkpoint",
    "read_config",
    "model_type_of",
    "guess_layout",
    "layout_rule",
    "family_of",
    "family_guidance",
    "require_decoder",
    "available_memory",
    "HEADROOM",
    "DEFAULT_PROMPT_LENGTH",
    "FAMILIES",
    "model_folder",
    "prompts_for",
    "estimate_memory",
    "estimate_memory_bytes",
    "check_memory",
    "default_device",
    "default_dtype",
    "resolve_dtype",
    "DTYPE_CHOICES",
    "FAMILY_GPU_DTYPES",
    "load_model",
    "family_defaults_table",
    "MODEL_CLASSES",
    "model_skeleton",
    "quantized_weight_bytes",
]

#: config.json ``model_type`` -> the adapter that drives it
MODEL_TYPES = {"janus": "JanusImageModel", "emu3": "Emu3ImageModel", "chameleon": "ChameleonImageModel",
               "glm_image": "GlmImageModel", "gemma": "LiquidImageModel"}
#: model_type -> FAMILY_DEFAULTS key, where the two differ only by name
_FAMILY_OF_TYPE = {"glm_image": "glm-image", "gemma": "liquid"}
#: a diffusers pipeline index's class -> its AR model's subfolder
_PIPELINE_MODELS = {"GlmImagePipeline": "vision_language_encoder"}
#: the family keys :func:`family_of` returns for checkpoint folders
FAMILIES = ("janus", "emu3", "lumina-mgpt", "anole", "lumina-mgpt-2", "glm-image", "liquid")
#: prompt tokens the memory check assumes when the prompts are not given
DEFAULT_PROMPT_LENGTH = 128
#: model_type -> the family name check_checkpoint's messages use
_CHECK_NAMES = {"glm_image": "GLM-Image", "gemma": "Liquid"}
#: the families prompts_for / estimate_memory / load_model know (keys of FAMILY_DEFAULTS)


def model_folder(folder: Path) -> Path:
    """The folder holding the AR model's config.json: ``folder``, or for a diffusers pipeline folder
    (``model_index.json`` of a known pipeline, GLM-Image's) its AR-model subfolder.

    Raises:
        ValueError: a diffusers pipeline csdgen does not drive (naming its class).
    """
    folder = Path(folder)
    index = folder / "model_index.json"
    if (folder / "config.json").is_file() or not index.is_file():
        return folder
    from csdgen.jsonio import read_json

    name = read_json(index, what="a diffusers pipeline index").get("_class_name")
    if name not in _PIPELINE_MODELS:
        raise ValueError(f"{str(index)!r} is a diffusers {name!r} pipeline; csdgen drives {', '.join(_PIPELINE_MODELS)} "
                         f"(or transformers folders with config.json)")
    return folder / _PIPELINE_MODELS[name]


def read_config(folder: Path) -> dict:
    """The folder's ``config.json`` (a pipeline folder's: see :func:`model_folder`), checked: a JSON
    object, and not the original Janus format.

    Raises:
        FileNotFoundError: no config.json. ValueError: not JSON or not an object (naming the
        file), or DeepSeek's original Janus format (``model_type`` ``multi_modality``).
    """
    from csdgen.jsonio import read_json

    file = model_folder(Path(folder)) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{str(folder)!r} has no config.json: not a transformers checkpoint folder")
    config = read_json(file, what="a transformers model config")
    if config.get("model_type") == "multi_modality":
        raise ValueError(
            f"{str(file)!r} is DeepSeek's original Janus format (model_type 'multi_modality'); csdgen loads the "
            f"transformers-format copy (model_type 'janus', e.g. the deepseek-community/Janus-Pro-7B repo): "
            f"download that and pass its folder")
    return config


def model_type_of(path: str | os.PathLike) -> str:
    """``config.json``'s ``model_type`` of a checkpoint folder, checked against :data:`MODEL_TYPES`.

    Raises:
        FileNotFoundError: no config.json. ValueError: unsupported model type.
    """
    model_type = read_config(Path(path)).get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{str(path)!r} has model_type={model_type!r}; supported families: {', '.join(MODEL_TYPES)}")
    return model_type


def guess_layout(path: str | os.PathLike, name: str | None = None) -> str:
    """Chameleon layout of a checkpoint, ``"lumina"`` or ``"anole"`` (rule in the module docstring).

    Args:
        path: the checkpoint folder; name: the repo id or path the user gave (default ``path``).
    """
    return layout_rule(read_config(Path(path)).get("architectures"), name, Path(path).name)


def family_of(path: str | os.PathLike, layout: str | None = None, name: str | None = None) -> str:
    """The key of :data:`~csdgen.models.defaults.FAMILY_DEFAULTS` for a checkpoint folder.

    ``janus``, ``emu3``, ``glm-image``, ``liquid``, or for Chameleon checkpoints ``lumina-mgpt-2``
    when the vocabulary holds ``<MOVQGAN...>`` image tokens, else ``lumina-mgpt`` / ``anole``
    (``layout`` when given, else :func:`guess_layout`).

    Raises:
        FileNotFoundError: no config.json. ValueError: unsupported model type or layout, or a
        layout given for a Lumina-mGPT 2.0 checkpoint.
    """
    model_type = model_type_of(path)
    if model_type != "chameleon":
        return _FAMILY_OF_TYPE.get(model_type, model_type)
    if movqgan_token_ids(read_config(Path(path)).get("vocabulary_map")):
        if layout is not None:
            raise ValueError(f"layout={layout!r}: {str(path)!r} is a Lumina-mGPT 2.0 checkpoint (<MOVQGAN...> image "
                             "tokens), which has one layout of its own; leave layout out")
        return "lumina-mgpt-2"
    layout = layout or guess_layout(path, name)
    if layout not in ("lumina", "anole"):
        raise ValueError(f"layout={layout!r}; allowed: lumina, anole")
    return "lumina-mgpt" if layout == "lumina" else "anole"


def require_decoder(model, name, folder: str | os.PathLike) -> None:
    """Refuse a checkpoint without its image decoder before generating (one line saying which files go where).

    Raises:
        ValueError: the model's ``vqgan`` is None (Chameleon's VQGAN, or Lumina-mGPT 2.0's MoVQGAN, not
            found), or its ``decoder_problem`` is set (GLM-Image without its diffusers pipeline).
    """
    folder = Path(folder)
    if getattr(model, "vqgan", True) is None:
        if type(model).__name__ == "Lumina2ImageModel":
            raise ValueError(f"{str(name)!r} has no image decoder: give --vqgan PATH (movqgan_270M.ckpt, SberAI's "
                             f"MoVQGAN 270M, which Lumina-mGPT 2.0 decodes with) or copy it into {str(folder)!r} or "
                             f"{str(folder / 'movqgan' / '270M')!r}")
        raise ValueError(f"{str(name)!r} has no image decoder: give --vqgan PATH (Chameleon's tokenizer/ folder holding "
                         f"vqgan.yaml and vqgan.ckpt) or copy those two files into {str(folder)!r} or "
                         f"{str(folder / 'tokenizer')!r}")
    if getattr(model, "decoder_problem", None):  # GLM-Image without its diffusers pipeline or without diffusers
        raise ValueError(f"{str(name)!r}: {model.decoder_problem}")


def family_guidance(family: str):
    """The family's own guidance schedule (:class:`csdgen.guidance.GuidanceSchedule`), None for a constant scale.

    ``lumina-mgpt-2``: :class:`~csdgen.models.lumina2.Lumina2Guidance`; every other family: None.
    """
    if family == "lumina-mgpt-2":
        from .lumina2 import Lumina2Guidance

        return Lumina2Guidance()
    return None


def default_device() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


#: what ``dtype`` / ``--dtype`` accepts: a name of ``DTYPES``, or ``auto`` (= None: :func:`resolve_dtype`'s default)
DTYPE_CHOICES = ("auto", *_DTYPES)

#: the dtype each family's reference code runs on a GPU (the released weights' dtype, what the authors'
#: inference scripts load: Janus-Pro, Emu3, Lumina-mGPT 1.0 and 2.0, Anole / Chameleon, GLM-Image and
#: Liquid all bfloat16); the built-in model was trained and is measured in float32. On a CPU every
#: model runs float32 (:func:`resolve_dtype`).
FAMILY_GPU_DTYPES = {"janus": torch.bfloat16, "emu3": torch.bfloat16, "lumina-mgpt": torch.bfloat16,
                     "anole": torch.bfloat16, "lumina-mgpt-2": torch.bfloat16, "glm-image": torch.bfloat16,
                     "liquid": torch.bfloat16, "builtin": torch.float32}


def default_dtype(device: str | torch.device, family: str | None = None) -> torch.dtype:
    """The dtype a model runs in when none is given: :func:`resolve_dtype`'s, without the reason.

    Args:
        device: where it runs. family: a key of :data:`FAMILY_GPU_DTYPES` (None: a released checkpoint's,
            bfloat16 on CUDA).
    """
    return resolve_dtype(None, device, family)[0]


def resolve_dtype(dtype: torch.dtype | str | None, device: str | torch.device,
                  family: str | None = None) -> tuple[torch.dtype, str]:
    """The dtype a model runs in, and why, in words for a run's first line.

    Given (a name of :data:`DTYPE_CHOICES` other than ``auto``, or a torch dtype of them): that one,
    ``"as given"``. Else (None or ``"auto"``): on CUDA the family's :data:`FAMILY_GPU_DTYPES` entry
    (``"the family's default on cuda"``; the built-in model: float32, ``"the built-in model's
    dtype"``); on any other device float32 (``"the default on cpu"``).

    Args:
        dtype: ``"auto"``, ``"float32"``, ``"bfloat16"``, ``"float16"``, a torch dtype of these, or None.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ... or a torch.device.
        family: a key of :data:`FAMILY_GPU_DTYPES`; None: a released checkpoint (bfloat16 on CUDA).

    Returns:
        ``(torch dtype, reason)``, e.g. ``(torch.bfloat16, "the family's default on cuda")``.

    Raises:
        ValueError: a dtype or family not allowed (one line naming the value and the allowed ones).
    """
    if family is not None and family not in FAMILY_GPU_DTYPES:
        raise ValueError(f"family={family!r}: allowed {', '.join(FAMILY_GPU_DTYPES)}")
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype], "as given"
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype, "as given"
    if dtype is not None and dtype != "auto":
        raise ValueError(f"dtype={dtype!r}: allowed {', '.join(DTYPE_CHOICES)}")
    kind = torch.device(device).type
    if family == "builtin":
        return torch.float32, "the built-in model's dtype"
    if kind == "cuda":
        return FAMILY_GPU_DTYPES[family or "janus"], "the family's default on cuda"
    return torch.float32, f"the default on {kind}"


def _dtype(dtype: torch.dtype | str | None, device: str | torch.device, family: str | None = None) -> torch.dtype:
    return resolve_dtype(dtype, device, family)[0]


def available_memory(device: str | torch.device) -> int:
    """Free bytes on ``device``: ``torch.cuda.mem_get_info`` on CUDA, MemAvailable (or sysconf) on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _square(height: int | None, width: int | None, family: str) -> int | None:
    if height != width:
        raise ValueError(f"{family} makes square images only; got height={height}, width={width}")
    return height


def prompts_for(path: str | os.PathLike, family: str, *, height: int | None = None, width: int | None = None,
                image_size: int | None = None, prompt_template: str | None = None, negative_prompt: str | None = None,
                positive_prompt: str | None = None, vqgan_dir: str | None = None):
    """The family's prompt builder from the checkpoint's config and tokenizer only (no weights read).

    Lumina-mGPT: a side not given comes from the folder's name
    (:func:`~csdgen.models.chameleon.lumina_pixel_size`).

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


def estimate_memory(path: str | os.PathLike, family: str, window: int, dtype: torch.dtype | str, *,
                    height: int | None = None, width: int | None = None, image_size: int | None = None,
                    guided: bool = True, prompt_length: int | None = None, vqgan_dir: str | None = None) -> MemoryEstimate:
    """The adapter's config-only memory estimate (weights not read), linear in the batch size.

    Args:
        family: a key of ``FAMILY_DEFAULTS`` as :func:`family_of` returns it.
        guided: two rows per image; GLM-Image always runs one (its AR stage has no guidance).
        prompt_length: tokens of the longest prompt row; default :data:`DEFAULT_PROMPT_LENGTH`.

    Raises:
        ValueError: unsupported family, size or dtype; FileNotFoundError: missing config/weights.
    """
    height, width = _size(height, width, image_size)
    dtype = _dtype(dtype, "cpu")
    length = DEFAULT_PROMPT_LENGTH if prompt_length is None else int(prompt_length)
    if family == "janus":
        from transformers import JanusConfig, JanusForConditionalGeneration

        from .janus import check_image_size, janus_memory

        config = JanusConfig.from_pretrained(check_checkpoint(path, "Janus"))
        check_image_size(config, _janus_size(height, width))
        return janus_memory(config, meta_parameter_count(JanusForConditionalGeneration, config), window, dtype, length, guided)
    if family == "emu3":
        from transformers import Emu3Config, Emu3ForConditionalGeneration

        from .emu3 import emu3_memory, image_grid

        config = Emu3Config.from_pretrained(check_checkpoint(path, "Emu3"))
        count = meta_parameter_count(Emu3ForConditionalGeneration, config)
        return emu3_memory(config, count, window, dtype, image_grid(config, height, width), length, guided)
    if family in ("lumina-mgpt", "anole"):
        from transformers import ChameleonConfig

        from .chameleon import ChameleonLayout, config_memory, lumina_pixel_size

        config = ChameleonConfig.from_pretrained(check_checkpoint(path, "Chameleon"))
        if family == "lumina-mgpt":
            height, width = lumina_pixel_size(height, width, path)
        layout = ChameleonLayout.build(config, "lumina" if family == "lumina-mgpt" else "anole", height, width)
        return config_memory(config, layout, window, dtype, guided, length)
    if family == "lumina-mgpt-2":
        from transformers import ChameleonConfig

        from ._transformers import load_tokenizer
        from .lumina2 import Lumina2Layout, lumina2_memory

        folder = check_checkpoint(path, "Lumina-mGPT 2.0")
        config = ChameleonConfig.from_pretrained(folder)
        layout = Lumina2Layout.build(config, height, width, load_tokenizer(folder))
        return lumina2_memory(config, layout, window, dtype, guided, length)
    if family == "glm-image":
        from transformers import GlmImageConfig

        from .glm_image import GlmImageFolders, GlmImageLayout, decoder_parameters, glm_image_memory

        parts = GlmImageFolders.find(path)
        config = GlmImageConfig.from_pretrained(check_checkpoint(parts.model, "GLM-Image"))
        return glm_image_memory(config, GlmImageLayout.build(height, width), window, dtype, length,
                                decoder=decoder_parameters(parts.pipeline))
    if family == "liquid":
        from .liquid import LiquidPrompts, liquid_memory

        prompts = LiquidPrompts.from_folder(path, vqgan_dir=vqgan_dir, image_size=_square(height, width, "Liquid"))
        return liquid_memory(prompts.config, prompts.num_image_tokens, prompts.codebook_size, window, dtype, guided, length)
    raise ValueError(f"family={family!r}; allowed: {', '.join(FAMILIES)}")


#: family -> the transformers class its checkpoints load as
MODEL_CLASSES = {"janus": "JanusForConditionalGeneration", "emu3": "Emu3ForConditionalGeneration",
                 "lumina-mgpt": "ChameleonForConditionalGeneration", "anole": "ChameleonForConditionalGeneration",
                 "lumina-mgpt-2": "ChameleonForConditionalGeneration", "glm-image": "GlmImageForConditionalGeneration",
                 "liquid": "GemmaForCausalLM"}


def model_skeleton(path: str | os.PathLike, family: str, dtype: torch.dtype) -> torch.nn.Module:
    """The family's transformers model of the folder's config built on the ``meta`` device (nothing allocated).

    Raises:
        ValueError: an unknown family.
    """
    import transformers
    from transformers import AutoConfig

    if family not in MODEL_CLASSES:
        raise ValueError(f"family={family!r}; allowed: {', '.join(MODEL_CLASSES)}")
    config = AutoConfig.from_pretrained(model_folder(Path(path)))
    with torch.device("meta"):
        return getattr(transformers, MODEL_CLASSES[family])._from_config(config, dtype=dtype)


def quantized_weight_bytes(path: str | os.PathLike, family: str, dtype: torch.dtype | str, quantize: str | None) -> int:
    """Bytes of a checkpoint's weights in ``dtype`` with its decoder layers quantised as ``quantize``
    (:func:`csdgen.models.memory.planned_weight_bytes` of :func:`model_skeleton`; no weight is read)."""
    from .memory import planned_weight_bytes

    dtype = _dtype(dtype, "cpu")
    skeleton = model_skeleton(path, family, dtype)
    total = planned_weight_bytes(skeleton, dtype, quantize)
    vq = getattr(getattr(skeleton, "model", skeleton), "vqmodel", None)
    if family == "lumina-mgpt-2" and vq is not None:  # the release holds no vqmodel: dropped on load
        total -= planned_weight_bytes(vq, dtype)
    return total


def estimate_memory_bytes(path: str | os.PathLike, family: str, batch_size: int, window: int, dtype: torch.dtype | str,
                          **kwargs) -> int:
    """:func:`estimate_memory` for ``batch_size`` images, in bytes (keyword arguments as there)."""
    return estimate_memory(path, family, window, dtype, **kwargs).bytes(batch_size)


def check_memory(path: str | os.PathLike, family: str, batch_size: int, window: int, dtype: torch.dtype | str | None,
                 *, device: str | torch.device | None = None, height: int | None = None, width: int | None = None,
                 image_size: int | None = None, guided: bool = True, max_memory_bytes: int | None = None,
                 prompt_length: int | None = None, vqgan_dir: str | None = None, quantize: str | None = None,
                 split: bool = False) -> int:
    """Refuse a batch that cannot fit, before any weight is read; return the estimate in bytes.

    The estimate (:func:`estimate_memory`) is computed once; it is linear in the batch size,
    which gives the largest batch that fits directly. Available memory: ``max_memory_bytes``
    when given, else :func:`available_memory` of ``device`` (default :func:`default_device`);
    the estimate may use all but :data:`~csdgen.models._transformers.HEADROOM` of it.

    With ``quantize``, the weights count at their quantised size (:mod:`csdgen.models.memory`); with
    ``split`` (a device map: accelerate places what does not fit elsewhere) nothing is refused.

    Raises:
        ValueError: one line naming the batch size, window, dtype, prompt length, the estimate,
            the available and usable memory, and the largest batch size that fits.
    """
    device = device or default_device()
    dtype = _dtype(dtype, device, family if family in FAMILY_GPU_DTYPES else None)
    estimate = estimate_memory(path, family, window, dtype, height=height, width=width, image_size=image_size,
                               guided=guided, prompt_length=prompt_length, vqgan_dir=vqgan_dir)
    if quantize is not None:
        from dataclasses import replace

        extra = estimate.fixed - estimate.parameters * estimate.element_size
        estimate = replace(estimate, fixed=quantized_weight_bytes(path, family, dtype, quantize) + max(extra, 0))
    if split:
        return estimate.bytes(batch_size)
    need = estimate.bytes(batch_size)
    have = available_memory(device) if max_memory_bytes is None else int(max_memory_bytes)
    if need <= estimate.usable(have):
        return need
    fits = min(estimate.largest_batch(have), batch_size - 1)
    hint = f"try --batch-size {fits}" if fits >= 1 else "even batch size 1 does not fit: try a smaller dtype, image or another device"
    length = DEFAULT_PROMPT_LENGTH if prompt_length is None else prompt_length
    raise ValueError(
        f"{family} at batch size {batch_size}, window {window}, {str(dtype).removeprefix('torch.')}, prompts of {length} tokens "
        f"needs about {need / 2**30:.2f} GiB but {torch.device(device).type} has {have / 2**30:.2f} GiB available "
        f"({estimate.usable(have) / 2**30:.2f} GiB after keeping {estimate.headroom:.0%} free); {hint}"
    )


def load_model(path_or_id: Any, *, dtype: torch.dtype | str | None = None, device: str | torch.device | None = None,
               layout: str | None = None, height: int | None = None, width: int | None = None, image_size: int | None = None,
               max_memory_bytes: int | None = None, batch_size: int | None = 1, window: int | None = None,
               guided: bool = True, negative_prompt: str | None = None, vqgan: Any = None,
               prompts: list[str] | None = None, prompt_template: str | None = None,
               positive_prompt: str | None = None, processor: Any = None, quantize: str | None = None,
               device_map: Any = None, offload_folder: str | os.PathLike | None = None) -> ImageTokenModel:
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

    Raises:
        FileNotFoundError: no such folder nor cached repo, or no config/weights.
        ValueError: an empty ``path_or_id`` (``""``, not the current folder); unsupported model type,
            layout, size, dtype or template; a prompt too long; not enough memory; a tokenizer that
            does not encode as its tokenizer.json.
        TypeError: ``path_or_id`` neither a path / repo id nor a supported transformers model.
    """
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
    folder = resolve_checkpoint(path_or_id)
    model_type = model_type_of(folder)
    if layout is not None and model_type != "chameleon":
        raise ValueError(f"layout={layout!r} applies to Chameleon checkpoints only; {str(path_or_id)!r} is {model_type}")
    for name, value in (("negative_prompt", negative_prompt), ("positive_prompt", positive_prompt)):
        if value is not None and model_type != "emu3":
            raise ValueError(f"{name} applies to Emu3 checkpoints only; {str(path_or_id)!r} is {model_type}")
    if vqgan is not None and model_type not in ("chameleon", "gemma"):
        raise ValueError(f"vqgan applies to Chameleon (Lumina-mGPT, Anole) and Liquid checkpoints only; {str(path_or_id)!r} "
                         f"is {model_type}")
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
    height, width = _size(height, width, image_size)
    with load_options(quantize, device_map, offload_folder):
        model = _load_family(family, folder, dtype, device, height, width, layout, vqgan, vqgan_dir, prompt_template,
                             negative_prompt, positive_prompt)
    model.quantize = quantize  # what csdgen generate's first line and csdgen plan report
    model.device_map = next((m.hf_device_map for m in vars(model).values() if getattr(m, "hf_device_map", None)),
                            None) if device_map is not None else None
    return model


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


def family_defaults_table() -> str:
    """The Markdown table of :data:`~csdgen.models.defaults.FAMILY_DEFAULTS` that docs/models.md holds.

    A test checks that docs/models.md contains exactly this text, so the two cannot drift.
    """
    from .defaults import FAMILY_DEFAULTS

    lines = ["| family | guidance scale | temperature | top-k | top-p | window | lambda | delta | sources | notes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, d in FAMILY_DEFAULTS.items():
        top_k = "none" if d.top_k is None else str(d.top_k)
        top_p = "none" if d.top_p is None else f"{d.top_p:g}"
        cells = [f"`{name}`", f"{d.guidance_scale:g}", f"{d.temperature:g}", top_k, top_p, str(d.window), f"{d.lam:g}",
                 f"{d.delta:g}", d.sources, d.notes or "-"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
