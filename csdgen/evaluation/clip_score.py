"""CLIP score of text-to-image outputs, as the papers compute it, from local weights only.

``CLIP score(I, C) = 100 * max(cos(E_I, E_C), 0)`` per image, where ``E_I`` and ``E_C`` are
CLIP's projected image and text embeddings (Hessel et al., "CLIPScore", 2021, with weight
100 instead of 2.5; the formula of torchmetrics' ``CLIPScore``, which the SJD code uses).
A set's score is the mean over its images. Default model: OpenAI CLIP ViT-L/14
(``openai/clip-vit-large-patch14``, torchmetrics' default), as the bench issue asks; the
CSD paper reports about 32 for Janus-Pro-7B on COCO, and our sources do not name its CLIP
model. Other conventions exist (ViT-B/32 with the prefix "A photo depicts ", used by
LlamaGen and LANTERN; ViT-B/16 on 299 px images in the SJD code): pass ``model`` and
``prefix`` to follow one, and say which in the report.

Differences from torchmetrics' ``CLIPScore``, chosen on purpose: the clamp at 0 is applied
per image (torchmetrics clamps the batch mean; identical whenever every cosine is positive,
as it is with trained CLIP models), and captions longer than CLIP's 77 positions are
truncated by the tokenizer, which keeps the end-of-text token the text embedding is read
from (torchmetrics slices the ids and drops it). The computation uses transformers'
``CLIPModel`` / ``CLIPProcessor`` directly: torchmetrics 1.9 would need a wrapper around
transformers 5's ``get_image_features`` output, and would hide the per-image scores.

Without torchvision (csdgen does not install it) transformers preprocesses images with its
PIL CLIP image processor (resize the short side, centre crop, normalise), its original CLIP
preprocessing. Weights are read from a local folder or the Hugging Face cache (``local_files_only``);
nothing is downloaded. Missing weights raise a one-line ``FileNotFoundError`` that says
what to download and which option to point at it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

__all__ = ["DEFAULT_CLIP_MODEL", "check_clip_path", "load_clip", "ClipScorer"]

#: Hugging Face id of the default CLIP model (OpenAI CLIP ViT-L/14, 224 px).
DEFAULT_CLIP_MODEL = "openai/clip-vit-large-patch14"


def _path_like(name: str) -> bool:
    """A value meant as a path, not a repo id: it holds a path separator, or starts with ``.`` or ``~``
    (a repo id is ``owner/name`` with one ``/`` and no leading ``.``; ``\\``, ``./``, ``a/b/c`` are paths)."""
    return name.startswith((".", "~", "/")) or "\\" in name or name.count("/") > 1


def check_clip_path(model: str | os.PathLike, *, option: str = "--clip-model") -> None:
    """Refuse a value meant as a path (``./x``, ``~/x``, ``a/b/c``, absolute) that is no folder, and a
    Hugging Face id whose ``config.json`` is not in the local cache, without loading anything (a command
    checks this before its own model loads).

    Raises:
        FileNotFoundError: one line: "no such folder" (or "a file, not a folder"), or what to download; naming the option.
    """
    name = str(model)
    if Path(name).expanduser().is_dir():
        return
    is_file = Path(name).expanduser().is_file()
    if _path_like(name) or is_file:  # no repo id: `hf download ./x` would be no help
        what = "a file, not a folder" if is_file else "no such folder"
        raise FileNotFoundError(f"{option} {name!r}: {what}; allowed: a folder holding a saved CLIP model "
                                f"and processor, or a Hugging Face id in the local cache (such as {DEFAULT_CLIP_MODEL})")
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except Exception:  # noqa: BLE001 - not a valid repo id: not in the cache either
        cached = None
    if not isinstance(cached, str):
        raise FileNotFoundError(
            f"{option} {name!r}: no such folder, and as a Hugging Face id not in the local cache; CLIP weights are "
            f"never downloaded by csdgen: on a machine "
            f"with internet run `hf download {name} --local-dir DIR`, copy DIR here and pass {option} DIR")


def load_clip(model: str | os.PathLike = DEFAULT_CLIP_MODEL, *, option: str = "--clip-model"):
    """A CLIP model and processor from a local folder or the Hugging Face cache, never the network.

    Args:
        model: a folder holding a saved ``CLIPModel`` and ``CLIPProcessor`` (``config.json``,
            weights, tokenizer and preprocessor files), or a Hugging Face id already in the cache.
        option: the command-line option that names the model, quoted in the error message.

    Returns:
        ``(CLIPModel in eval mode, CLIPProcessor)``.

    Raises:
        FileNotFoundError: one line: a path (``./x``, ``~/x``, ``a/b/c``) that is no folder is "no such
            folder"; else naming the model, what to download and the option to set.
        ValueError: a folder whose config.json is no JSON object or whose weight file is cut short or
            garbled, naming the file.
    """
    from transformers import CLIPModel, CLIPProcessor
    from transformers.utils import logging as hf_logging

    name = str(model)
    is_folder = Path(name).expanduser().is_dir()
    check_clip_path(name, option=option)
    source = str(Path(name).expanduser()) if is_folder else name
    if is_folder:  # a file cut short or garbled is named in one line, not by the loader's traceback
        from csdgen.jsonio import read_json
        from csdgen.models._transformers import check_weight_files

        if (Path(source) / "config.json").is_file():
            read_json(Path(source) / "config.json", what=f"a CLIP model's config ({option})")
        check_weight_files(Path(source))
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the torchvision fallback notice of the image processor is noise here
    try:
        clip = CLIPModel.from_pretrained(source, local_files_only=True)
        processor = CLIPProcessor.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError) as error:
        hub_id = DEFAULT_CLIP_MODEL if is_folder else name
        where = f"the folder {source}" if is_folder else f"the Hugging Face cache for {name!r}"
        raise FileNotFoundError(
            f"CLIP weights not found in {where} ({type(error).__name__}; csdgen never downloads): on a machine "
            f"with internet run `hf download {hub_id} --local-dir DIR`, copy DIR here and pass {option} DIR"
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)
    return clip.eval(), processor


_FORMATS = "a uint8 tensor [B, 3, H, W], a uint8 array [B, H, W, 3] or a list of PIL images"


def _to_pil(images) -> list[Image.Image]:
    if isinstance(images, np.ndarray):  # what csdgen.evaluation.maps.to_uint8 returns
        if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
            raise ValueError(f"images must be {_FORMATS}, got an array of {images.dtype} {tuple(images.shape)}")
        return [Image.fromarray(np.ascontiguousarray(a)) for a in images]
    if isinstance(images, torch.Tensor):
        if images.dim() != 4 or images.shape[1] != 3 or images.dtype != torch.uint8:
            raise ValueError(f"images must be {_FORMATS}, got "
                             f"{images.dtype} {tuple(images.shape)} (csdgen.evaluation.maps.to_uint8 converts [-1, 1] floats)")
        array = images.permute(0, 2, 3, 1).cpu().numpy()
        return [Image.fromarray(np.ascontiguousarray(a)) for a in array]
    out = []
    for image in images:
        if not isinstance(image, Image.Image):
            raise ValueError(f"images must be {_FORMATS}, got a list of {type(image).__name__}")
        out.append(image.convert("RGB"))
    return out


class ClipScorer:
    """CLIP score of images against their prompts.

    Args:
        model: a local folder or a cached Hugging Face id (see :func:`load_clip`).
        device: where CLIP runs.
        dtype: CLIP's parameter dtype (cosines are computed in float32 from its features).
        prefix: text put before every prompt (e.g. ``"A photo depicts "``, the GigaGAN convention).
        batch_size: image-prompt pairs per forward.
        option: command-line option named in the missing-weights error.

    Raises:
        FileNotFoundError: missing weights (one line, see :func:`load_clip`).
    """

    def __init__(self, model: str | os.PathLike = DEFAULT_CLIP_MODEL, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, prefix: str = "", batch_size: int = 32, option: str = "--clip-model"):
        self.name = str(model)
        self.model, self.processor = load_clip(model, option=option)
        self.model.to(device=device, dtype=dtype)
        self.device = torch.device(device)
        self.prefix = prefix
        self.batch_size = int(batch_size)
        self.max_length = int(self.model.config.text_config.max_position_embeddings)

    @staticmethod
    def _features(output) -> torch.Tensor:
        # transformers 5 returns an output object whose pooler_output is the projected embedding
        return (output if isinstance(output, torch.Tensor) else output.pooler_output).float()

    @torch.no_grad()
    def cosine(self, images, prompts: Sequence[str]) -> torch.Tensor:
        """Cosine similarity of each image's CLIP embedding with its prompt's.

        Args:
            images: ``[B, 3, H, W]`` uint8 tensor (0..255), ``[B, H, W, 3]`` uint8 array
                (:func:`csdgen.evaluation.maps.to_uint8` of decoded images) or ``B`` PIL images.
            prompts: ``B`` strings (``prefix`` is put before each).

        Returns:
            ``[B]`` float32 in [-1, 1], on the CPU.

        Raises:
            ValueError: image format, or a different number of images and prompts.
        """
        pil = _to_pil(images)
        if len(pil) != len(prompts):
            raise ValueError(f"got {len(pil)} images and {len(prompts)} prompts; CLIP score needs one prompt per image")
        out = []
        for start in range(0, len(pil), self.batch_size):
            texts = [self.prefix + str(p) for p in prompts[start : start + self.batch_size]]
            inputs = self.processor(text=texts, images=pil[start : start + self.batch_size], return_tensors="pt",
                                    padding=True, truncation=True, max_length=self.max_length)
            pixels = inputs["pixel_values"].to(self.device, self.model.dtype)
            image_features = self._features(self.model.get_image_features(pixel_values=pixels))
            text_features = self._features(self.model.get_text_features(
                input_ids=inputs["input_ids"].to(self.device), attention_mask=inputs["attention_mask"].to(self.device)))
            out.append(torch.nn.functional.cosine_similarity(image_features, text_features, dim=-1).cpu())
        return torch.cat(out) if out else torch.zeros(0)

    def score(self, images, prompts: Sequence[str]) -> torch.Tensor:
        """Per-image CLIP score ``100 * max(cos, 0)``: ``[B]`` float32 in [0, 100] (mean it for a set)."""
        return 100 * self.cosine(images, prompts).clamp_min(0)
