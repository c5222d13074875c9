"""Which family a checkpoint folder holds, from its ``config.json`` alone (no weight read).

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

Also the family's own guidance schedule (:func:`family_guidance`). Transformers and the adapters are
imported inside the functions only.
"""

from __future__ import annotations

import os
from pathlib import Path

from ._transformers import checkpoint_tensor_names, movqgan_token_ids
from .sources import layout_rule

__all__ = ["MODEL_TYPES", "FAMILIES", "model_folder", "read_config", "model_type_of", "weights_model_type", "guess_layout",
           "family_of", "family_guidance"]

#: config.json ``model_type`` -> the adapter that drives it
MODEL_TYPES = {"janus": "JanusImageModel", "emu3": "Emu3ImageModel", "chameleon": "ChameleonImageModel",
               "glm_image": "GlmImageModel", "gemma": "LiquidImageModel"}
#: model_type -> the families a user knows it as (messages name both)
MODEL_TYPE_NAMES = {"janus": "Janus-Pro", "emu3": "Emu3", "chameleon": "Lumina-mGPT 1.0 and 2.0, Anole",
                    "glm_image": "GLM-Image", "gemma": "Liquid"}


def model_type_named(model_type: str) -> str:
    """``"gemma (Liquid)"``: a supported ``model_type`` with the families it holds, for messages."""
    return f"{model_type} ({MODEL_TYPE_NAMES[model_type]})" if model_type in MODEL_TYPE_NAMES else repr(model_type)


#: model_type -> FAMILY_DEFAULTS key, where the two differ only by name
_FAMILY_OF_TYPE = {"glm_image": "glm-image", "gemma": "liquid"}
#: a diffusers pipeline index's class -> its AR model's subfolder
_PIPELINE_MODELS = {"GlmImagePipeline": "vision_language_encoder"}
#: the family keys :func:`family_of` returns for checkpoint folders
FAMILIES = ("janus", "emu3", "lumina-mgpt", "anole", "lumina-mgpt-2", "glm-image", "liquid")


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


def refuse_builtin_weights(path: str | os.PathLike, config: dict | None = None) -> None:
    """Refuse a built-in model's weights folder (``csdgen/builtin/weights``: its config.json holds
    ``class_names`` and ``codebook_size``, no ``model_type``) given where a checkpoint is asked for.
    Anything else, a missing or unreadable config.json included, is left to :func:`read_config`.

    Raises:
        ValueError: ``'PATH' is a built-in model's weights folder, not a checkpoint: give it as --weights FOLDER ...``.
    """
    if config is None:
        try:
            from csdgen.jsonio import read_json

            config = read_json(Path(path) / "config.json", what="a config")
        except (OSError, ValueError):
            return
    if isinstance(config, dict) and config.get("model_type") is None and "class_names" in config \
            and "codebook_size" in config:
        raise ValueError(f"{str(path)!r} is a built-in model's weights folder, not a checkpoint: give it as --weights "
                         f"FOLDER (and leave --model out, or --model builtin)")


def model_type_of(path: str | os.PathLike) -> str:
    """``config.json``'s ``model_type`` of a checkpoint folder, checked against :data:`MODEL_TYPES` and
    against the folder's weights (:func:`weights_model_type`: a config.json of another family copied over
    them is refused here, not read as its own family's adapter would read it).

    Raises:
        FileNotFoundError: no config.json. ValueError: unsupported model type, or a config.json of
        another family than the weights beside it.
    """
    config = read_config(Path(path))
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        refuse_builtin_weights(path, config)
        raise ValueError(f"{str(path)!r} has model_type={model_type!r}; supported: "
                         f"{', '.join(map(model_type_named, MODEL_TYPES))}")
    folder = model_folder(Path(path))
    weights = weights_model_type(folder)
    if weights is not None and weights != model_type:
        raise ValueError(f"{str(folder / 'config.json')!r} is a config of another family: model_type {model_type!r} "
                         f"({MODEL_TYPE_NAMES[model_type]}), while the weights beside it are laid out for "
                         f"{model_type_named(weights)}; expected the config.json saved with these weights (model_type "
                         f"{weights!r}): copy it back into the folder")
    return model_type


def _tensor_names(folder: Path) -> set[str] | None:
    """The tensor names of a folder's weights, from its weight index or its safetensors headers (nothing else
    read: ``.bin`` files are not opened); None where there are none, or they cannot be read (the loader names
    what is wrong with them)."""
    try:
        return checkpoint_tensor_names(folder, read_bin=False) or None
    except (OSError, ValueError):
        return None


def weights_model_type(folder: str | os.PathLike) -> str | None:
    """The :data:`MODEL_TYPES` key a folder's weights are laid out for, by their tensor names alone, where
    they tell: ``janus`` (a ``generation_head``), ``glm_image`` (``model.visual`` beside
    ``model.language_model``), ``emu3`` (``text_model.model``), ``chameleon`` (decoder layers at
    ``model.layers`` with q/k norms: Lumina-mGPT 1.0 and 2.0, Anole), ``gemma`` (decoder layers at
    ``model.layers`` without q/k norms: Liquid). None: no safetensors weights, or names none of these fit."""
    names = _tensor_names(Path(folder))
    if not names:
        return None
    if any(n.startswith(("model.generation_head.", "generation_head.")) for n in names):
        return "janus"
    if any(n.startswith("model.visual.") for n in names) and any(n.startswith("model.language_model.") for n in names):
        return "glm_image"
    if any(n.startswith(("text_model.model.", "model.text_model.")) for n in names):
        return "emu3"
    layers = [n for n in names if n.startswith("model.layers.")]
    if not layers:
        return None
    return "chameleon" if any(".self_attn.q_norm." in n for n in layers) else "gemma"


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


def family_guidance(family: str):
    """The family's own guidance schedule (:class:`csdgen.guidance.GuidanceSchedule`), None for a constant scale.

    ``lumina-mgpt-2``: :class:`~csdgen.models.lumina2.Lumina2Guidance`; every other family: None.
    """
    if family == "lumina-mgpt-2":
        from .lumina2 import Lumina2Guidance

        return Lumina2Guidance()
    return None

