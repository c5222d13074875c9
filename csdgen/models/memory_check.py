"""A checkpoint folder's memory need before any weight is read.

:func:`estimate_memory` is the family adapter's config-only estimate
(:class:`~csdgen.models._transformers.MemoryEstimate`, linear in the batch size: fixed bytes plus
bytes per image); :func:`available_memory` is the device's free memory. With quantised weights the
weights count at their planned size (:func:`quantized_weight_bytes`, the arithmetic of
:mod:`csdgen.models.memory`, on the model built on the ``meta`` device by :func:`model_skeleton`).
The memory plan (:func:`csdgen.models.plan.checkpoint_plan`) adds the engine's cache width and one
forward's activations, and :func:`csdgen.models.plan.check_memory` refuses a batch it does not fit.

Transformers and the adapters are imported inside the functions only.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ._transformers import MemoryEstimate, check_checkpoint, meta_parameter_count
from .detect import FAMILIES, model_folder
from .dtypes import _dtype
from .sources import janus_side as _janus_size
from .sources import size_arguments as _size
from .sources import square_side as _square

__all__ = ["DEFAULT_PROMPT_LENGTH", "available_memory", "estimate_memory", "MODEL_CLASSES", "model_skeleton",
           "quantized_weight_bytes", "estimate_memory_bytes"]

#: prompt tokens the memory check assumes when the prompts are not given
DEFAULT_PROMPT_LENGTH = 128


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
