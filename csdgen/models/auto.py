"""Load any supported checkpoint by its folder or Hugging Face repo id: family detection, memory check.

The family comes from ``config.json``'s ``model_type``:

* ``janus`` -> :class:`~csdgen.models.janus.JanusImageModel` (defaults ``FAMILY_DEFAULTS["janus"]``);
* ``emu3`` -> :class:`~csdgen.models.emu3.Emu3ImageModel` (``"emu3"``);
* ``chameleon`` -> :class:`~csdgen.models.chameleon.ChameleonImageModel`, layout ``"lumina"``
  (defaults ``"lumina-mgpt"``) or ``"anole"`` (``"anole"``); or, when the vocabulary holds
  ``<MOVQGAN...>`` image tokens, :class:`~csdgen.models.lumina2.Lumina2ImageModel`
  (``"lumina-mgpt-2"``): Lumina-mGPT 2.0 also says ``chameleon`` and ``ChameleonXLLMX...``, but its
  image tokens are MoVQGAN codes, so it is never read as Lumina-mGPT 1.0 (no ``layout`` applies).

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

import torch

from ._transformers import DTYPES as _DTYPES
from ._transformers import HEADROOM, MemoryEstimate, check_checkpoint, meta_parameter_count, movqgan_token_ids
from .base import ImageTokenModel

__all__ = [
    "MODEL_TYPES",
    "FAMILIES",
    "resolve_checkpoint",
    "read_config",
    "model_type_of",
    "guess_layout",
    "family_of",
    "family_guidance",
    "require_decoder",
    "available_memory",
    "HEADROOM",
    "DEFAULT_PROMPT_LENGTH",
    "prompts_for",
    "estimate_memory",
    "estimate_memory_bytes",
    "check_memory",
    "default_device",
    "default_dtype",
    "load_model",
    "family_defaults_table",
]

#: config.json ``model_type`` -> the adapter that drives it
MODEL_TYPES = {"janus": "JanusImageModel", "emu3": "Emu3ImageModel", "chameleon": "ChameleonImageModel"}
_LUMINA_ARCHITECTURES = ("ChameleonXLLMXForConditionalGeneration",)
#: the family keys :func:`family_of` returns for checkpoint folders
FAMILIES = ("janus", "emu3", "lumina-mgpt", "anole", "lumina-mgpt-2")
#: prompt tokens the memory check assumes when the prompts are not given
DEFAULT_PROMPT_LENGTH = 128


def resolve_checkpoint(path_or_id: str | os.PathLike) -> Path:
    """A local folder, or a repo id found in the local Hugging Face cache -> the folder.

    Raises:
        FileNotFoundError: neither an existing folder nor a cached repo id (says how to get it).
    """
    folder = Path(path_or_id).expanduser()
    if folder.is_dir():
        return folder
    if folder.exists():
        raise FileNotFoundError(f"model {str(path_or_id)!r} is a file; give the checkpoint folder (config.json + weights)")
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(str(path_or_id), local_files_only=True))
    except Exception:  # not a valid repo id, or not cached: both mean "not here"
        raise FileNotFoundError(
            f"model {str(path_or_id)!r}: no such folder, and no Hugging Face repo of that id in the local cache "
            f"{constants.HF_HUB_CACHE} (csdgen never downloads). Download it on a machine with network "
            f"(e.g. `hf download <repo id> --local-dir DIR`), copy DIR here and pass --model DIR"
        ) from None


def read_config(folder: Path) -> dict:
    """The folder's ``config.json``, checked: a JSON object, and not the original Janus format.

    Raises:
        FileNotFoundError: no config.json. ValueError: not JSON or not an object (naming the
        file), or DeepSeek's original Janus format (``model_type`` ``multi_modality``).
    """
    from csdgen.runs import read_json

    file = folder / "config.json"
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
    if any(a in _LUMINA_ARCHITECTURES for a in read_config(Path(path)).get("architectures") or ()):
        return "lumina"
    text = f"{name or ''} {Path(path).name}".lower()
    return "anole" if "anole" in text and "lumina" not in text else "lumina"


def family_of(path: str | os.PathLike, layout: str | None = None, name: str | None = None) -> str:
    """The key of :data:`~csdgen.models.defaults.FAMILY_DEFAULTS` for a checkpoint folder.

    ``janus``, ``emu3``, or for Chameleon checkpoints ``lumina-mgpt-2`` when the vocabulary holds
    ``<MOVQGAN...>`` image tokens, else ``lumina-mgpt`` / ``anole`` (``layout`` when given, else
    :func:`guess_layout`).

    Raises:
        FileNotFoundError: no config.json. ValueError: unsupported model type or layout, or a
        layout given for a Lumina-mGPT 2.0 checkpoint.
    """
    model_type = model_type_of(path)
    if model_type != "chameleon":
        return model_type
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
        ValueError: the model's ``vqgan`` is None (Chameleon's VQGAN, or Lumina-mGPT 2.0's MoVQGAN, not found).
    """
    if getattr(model, "vqgan", True) is not None:
        return
    folder = Path(folder)
    if type(model).__name__ == "Lumina2ImageModel":
        raise ValueError(f"{str(name)!r} has no image decoder: copy movqgan_270M.ckpt (SberAI's MoVQGAN 270M, which "
                         f"Lumina-mGPT 2.0 decodes with) into {str(folder)!r} or {str(folder / 'movqgan' / '270M')!r}")
    raise ValueError(f"{str(name)!r} has no image decoder: copy Chameleon's vqgan.yaml and vqgan.ckpt "
                     f"(its tokenizer/ folder) into {str(folder)!r} or {str(folder / 'tokenizer')!r}")


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


def default_dtype(device: str | torch.device) -> torch.dtype:
    """bfloat16 on CUDA (the released checkpoints' dtype), float32 on CPU."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def _dtype(dtype: torch.dtype | str | None, device: str | torch.device) -> torch.dtype:
    if dtype is None:
        return default_dtype(device)
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    if dtype in _DTYPES.values():
        return dtype
    raise ValueError(f"dtype={dtype!r}: allowed {', '.join(_DTYPES)}")


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


def _size(height: int | None, width: int | None, image_size: int | None) -> tuple[int | None, int | None]:
    if image_size is not None and (height is not None or width is not None):
        raise ValueError(f"image_size={image_size} together with height/width: give one or the other")
    return (image_size, image_size) if image_size is not None else (height, width)


def _janus_size(height: int | None, width: int | None) -> int | None:
    if height != width:
        raise ValueError(f"Janus makes square images only; got height={height}, width={width}")
    return height


def prompts_for(path: str | os.PathLike, family: str, *, height: int | None = None, width: int | None = None,
                image_size: int | None = None, prompt_template: str | None = None, negative_prompt: str | None = None,
                positive_prompt: str | None = None):
    """The family's prompt builder from the checkpoint's config and tokenizer only (no weights read).

    :class:`~csdgen.models.janus.JanusPrompts`, :class:`~csdgen.models.emu3.Emu3Prompts` or
    :class:`~csdgen.models.chameleon.ChameleonPrompts`; building it checks the image size.

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
        from .chameleon import ChameleonPrompts

        layout = "lumina" if family == "lumina-mgpt" else "anole"
        return ChameleonPrompts.from_folder(path, layout=layout, height=height, width=width, **template)
    if family == "lumina-mgpt-2":
        from .lumina2 import Lumina2Prompts

        return Lumina2Prompts.from_folder(path, height=height, width=width, **template)
    raise ValueError(f"family={family!r}; allowed: {', '.join(FAMILIES)}")


def estimate_memory(path: str | os.PathLike, family: str, window: int, dtype: torch.dtype | str, *,
                    height: int | None = None, width: int | None = None, image_size: int | None = None,
                    guided: bool = True, prompt_length: int | None = None) -> MemoryEstimate:
    """The adapter's config-only memory estimate (weights not read), linear in the batch size.

    Args:
        family: a key of ``FAMILY_DEFAULTS`` as :func:`family_of` returns it.
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

        from .chameleon import ChameleonLayout, config_memory

        config = ChameleonConfig.from_pretrained(check_checkpoint(path, "Chameleon"))
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
    raise ValueError(f"family={family!r}; allowed: {', '.join(FAMILIES)}")


def estimate_memory_bytes(path: str | os.PathLike, family: str, batch_size: int, window: int, dtype: torch.dtype | str,
                          **kwargs) -> int:
    """:func:`estimate_memory` for ``batch_size`` images, in bytes (keyword arguments as there)."""
    return estimate_memory(path, family, window, dtype, **kwargs).bytes(batch_size)


def check_memory(path: str | os.PathLike, family: str, batch_size: int, window: int, dtype: torch.dtype | str | None,
                 *, device: str | torch.device | None = None, height: int | None = None, width: int | None = None,
                 image_size: int | None = None, guided: bool = True, max_memory_bytes: int | None = None,
                 prompt_length: int | None = None) -> int:
    """Refuse a batch that cannot fit, before any weight is read; return the estimate in bytes.

    The estimate (:func:`estimate_memory`) is computed once; it is linear in the batch size,
    which gives the largest batch that fits directly. Available memory: ``max_memory_bytes``
    when given, else :func:`available_memory` of ``device`` (default :func:`default_device`);
    the estimate may use all but :data:`~csdgen.models._transformers.HEADROOM` of it.

    Raises:
        ValueError: one line naming the batch size, window, dtype, prompt length, the estimate,
            the available and usable memory, and the largest batch size that fits.
    """
    device = device or default_device()
    dtype = _dtype(dtype, device)
    estimate = estimate_memory(path, family, window, dtype, height=height, width=width, image_size=image_size,
                               guided=guided, prompt_length=prompt_length)
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


def load_model(path_or_id: str | os.PathLike, *, dtype: torch.dtype | str | None = None, device: str | torch.device | None = None,
               layout: str | None = None, height: int | None = None, width: int | None = None, image_size: int | None = None,
               max_memory_bytes: int | None = None, batch_size: int | None = 1, window: int | None = None,
               guided: bool = True, negative_prompt: str | None = None, vqgan_dir: str | None = None,
               prompts: list[str] | None = None, prompt_template: str | None = None,
               positive_prompt: str | None = None) -> ImageTokenModel:
    """Load a Janus, Emu3, Chameleon-format (Lumina-mGPT / Anole) or Lumina-mGPT 2.0 checkpoint as an image-token model.

    Before any weight is read: the family, the image size, the prompt template and special
    tokens (from the config and tokenizer), then -- when ``prompts`` are given -- their
    length against ``max_position_embeddings``, then the memory for ``batch_size`` images
    with the real prompt length (else :data:`DEFAULT_PROMPT_LENGTH` tokens).

    Args:
        path_or_id: a local checkpoint folder, or a Hugging Face repo id already in the local cache.
        dtype: float32 / bfloat16 / float16 (default :func:`default_dtype` of the device).
        device: default :func:`default_device`.
        layout: Chameleon only, ``"lumina"`` or ``"anole"`` (default :func:`guess_layout`).
        height, width / image_size: output size in pixels (default: the family's).
        max_memory_bytes: memory budget for the check (default: what the device has free).
        batch_size, window: what the memory check assumes (batch_size None: no check; window
            default: the family's).
        negative_prompt: Emu3 only, the unconditional rows' prompt (default Emu3's documented one).
        positive_prompt: Emu3 only, appended to each prompt string (default Emu3's; ``""`` = off).
        vqgan_dir: Chameleon: folder of Chameleon's ``vqgan.yaml`` + ``vqgan.ckpt`` (default:
            the checkpoint folder or its ``tokenizer/`` when they hold both, else no image decoder);
            Lumina-mGPT 2.0: folder of ``movqgan_270M.ckpt`` (default: the checkpoint folder, its
            ``movqgan/`` or ``movqgan/270M/``, else no image decoder).
        prompts: the prompt strings the run will use (for the length and memory checks).
        prompt_template: ``{prompt}``, ``{width}``, ``{height}`` template for prompt strings
            (default: the family's, see docs/models.md).

    Raises:
        FileNotFoundError: no such folder nor cached repo, or no config/weights.
        ValueError: unsupported model type, layout, size, dtype or template; a prompt too long;
            not enough memory.
    """
    folder = resolve_checkpoint(path_or_id)
    model_type = model_type_of(folder)
    if layout is not None and model_type != "chameleon":
        raise ValueError(f"layout={layout!r} applies to Chameleon checkpoints only; {str(path_or_id)!r} is {model_type}")
    for name, value in (("negative_prompt", negative_prompt), ("positive_prompt", positive_prompt)):
        if value is not None and model_type != "emu3":
            raise ValueError(f"{name} applies to Emu3 checkpoints only; {str(path_or_id)!r} is {model_type}")
    family = family_of(folder, layout, str(path_or_id))
    device = device or default_device()
    dtype = _dtype(dtype, device)
    check_checkpoint(folder, "Lumina-mGPT 2.0" if family == "lumina-mgpt-2" else model_type.capitalize())
    builder = prompts_for(folder, family, height=height, width=width, image_size=image_size, prompt_template=prompt_template,
                          negative_prompt=negative_prompt, positive_prompt=positive_prompt)
    prompt_length = None
    if prompts:
        prompt_length = builder.prompt_length(list(prompts))
        builder.check_length(prompt_length)
    if batch_size is not None:
        from .defaults import FAMILY_DEFAULTS

        check_memory(folder, family, batch_size, window or FAMILY_DEFAULTS[family].window, dtype, device=device,
                     height=height, width=width, image_size=image_size, guided=guided, max_memory_bytes=max_memory_bytes,
                     prompt_length=prompt_length)
    height, width = _size(height, width, image_size)
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
    from .chameleon import ChameleonImageModel

    kind = "lumina" if family == "lumina-mgpt" else "anole"
    return ChameleonImageModel.from_pretrained(str(folder), dtype=dtype, device=device, layout=kind, height=height, width=width,
                                               vqgan_dir=vqgan_dir, prompt_template=prompt_template)


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
