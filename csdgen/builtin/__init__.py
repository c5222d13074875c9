"""The small built-in image model of csdgen: VQ tokenizer + class-conditional Llama AR
model + emoji classifier, trained on the 1,911 Noto emoji of the npm package
emoji-datasource-google (``emoji.py``, ``train.py``; README.md in this folder).

``load_components()`` loads everything offline from ``csdgen/builtin/weights/`` (weights
stored float16, loaded as float32). Token layout of the AR model, with ``V`` =
``config["codebook_size"]`` (1024): codes are ids ``0 .. V - 1``, class ``c`` is id ``V + c``
and the null (unconditional) class is id ``V + num_classes``; a sequence is
``[class_token, code_0, ..., code_255]`` in raster order over the 16 x 16 grid.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from .classifier import CropClassifier
from .vq import VQConfig, VQTokenizer

DEFAULT_WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"


@dataclass
class BuiltinComponents:
    """Loaded built-in model (all modules float32, eval mode, CPU)."""

    vq: VQTokenizer
    ar: "torch.nn.Module"           # transformers.LlamaForCausalLM
    classifier: CropClassifier
    config: dict = field(default_factory=dict)
    weights_dir: Path | None = None

    @property
    def class_names(self) -> list[str]:
        return list(self.config["class_names"])

    @property
    def num_classes(self) -> int:
        return len(self.config["class_names"])

    @property
    def codebook_size(self) -> int:
        return int(self.config["codebook_size"])

    @property
    def null_class_id(self) -> int:
        """Token id of the unconditional (null) class."""
        return int(self.config["null_class_id"])

    def class_token(self, c: int) -> int:
        """Token id of class index ``c`` (0 <= c < num_classes)."""
        if not 0 <= c < self.num_classes:
            raise ValueError(f"class index {c} out of range [0, {self.num_classes})")
        return self.codebook_size + c


def build_ar_model(llama_config: dict):
    """Fresh LlamaForCausalLM (random init, float32) from a LlamaConfig dict."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig.from_dict(dict(llama_config)))


#: config.json keys the loader and :class:`csdgen.models.builtin.BuiltinModel` read
REQUIRED_KEYS = ("codebook_size", "num_classes", "grid", "class_names", "null_class_id", "vq", "llama", "classifier")


def _load_state(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``path`` as float32.

    Raises:
        FileNotFoundError: no such file. ValueError: a file safetensors cannot read (truncated, not
            safetensors), one line naming it and the reason.
    """
    from safetensors import SafetensorError

    if not path.is_file():
        raise FileNotFoundError(f"no {path.name} in {path.parent}: the built-in weights need config.json, vq.safetensors, "
                                f"ar.safetensors and classifier.safetensors")
    try:
        return {k: v.float() for k, v in load_file(str(path)).items()}
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise ValueError(f"unreadable safetensors file {path}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _read_config(path: Path) -> dict:
    """config.json of a weights folder (:func:`csdgen.jsonio.read_json`), checked for :data:`REQUIRED_KEYS`.

    Raises:
        ValueError: not JSON, not an object, or keys missing (one line naming the file and the keys).
    """
    from csdgen.jsonio import read_json

    config = read_json(path, what="the built-in model's config")
    missing = [k for k in REQUIRED_KEYS if k not in config]
    if missing:
        raise ValueError(f"missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} in {str(path)!r}; "
                         f"the built-in model's config.json holds {', '.join(REQUIRED_KEYS)}")
    return config


def _build(what: str, path: Path, make):
    """``make()`` (a module from config.json's ``what``), its errors as one ValueError naming the key and file."""
    try:
        return make()
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"config.json's {what!r} in {path.parent} does not build the model: {_first_line(exc)}") from None


def _load_into(module: torch.nn.Module, path: Path) -> None:
    """Load ``path``'s tensors into ``module`` (one ValueError naming the file when they do not fit config.json)."""
    state = _load_state(path)
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = lines[1] if len(lines) > 1 else _first_line(exc)
        raise ValueError(f"{path} does not match config.json: {detail}") from None


def load_components(weights_dir: str | os.PathLike | None = None) -> BuiltinComponents:
    """Load VQ tokenizer, Llama AR model, classifier and config.json (offline).

    Raises:
        FileNotFoundError: no such folder, or a file of the weights missing (one line).
        ValueError: ``weights_dir`` is a file; config.json not JSON or lacking a key of
            :data:`REQUIRED_KEYS`; a .safetensors file unreadable or not matching config.json
            (one line naming the file and what is wrong).
    """
    wdir = Path(weights_dir) if weights_dir is not None else DEFAULT_WEIGHTS_DIR
    if wdir.exists() and not wdir.is_dir():
        raise ValueError(f"no built-in weights in {wdir}: it is a file, not a folder; give the folder that holds "
                         f"config.json and the .safetensors files (or leave --weights out for the shipped weights)")
    if not wdir.is_dir():  # a mistyped --weights: training is not the advice
        raise FileNotFoundError(f"no built-in weights in {wdir}: no such folder; give the folder that holds config.json "
                                f"and the .safetensors files (or leave --weights out for the shipped weights)")
    if not (wdir / "config.json").is_file():
        raise FileNotFoundError(f"no built-in weights in {wdir}: it holds no config.json; give the folder that holds "
                                f"config.json and the .safetensors files (or leave --weights out for the shipped "
                                f"weights; python -m csdgen.builtin.train writes such a folder)")
    path = wdir / "config.json"
    config = _read_config(path)
    vq = _build("vq", path, lambda: VQTokenizer(VQConfig(**config["vq"])))
    _load_into(vq, wdir / "vq.safetensors")
    ar = _build("llama", path, lambda: build_ar_model(config["llama"]))
    _load_into(ar, wdir / "ar.safetensors")
    classifier = _build("classifier", path, lambda: CropClassifier(**config["classifier"]))
    _load_into(classifier, wdir / "classifier.safetensors")
    return BuiltinComponents(vq=vq.float().eval(), ar=ar.float().eval(),
                             classifier=classifier.float().eval(), config=config, weights_dir=wdir)


__all__ = ["BuiltinComponents", "CropClassifier", "VQConfig", "VQTokenizer",
           "build_ar_model", "load_components", "DEFAULT_WEIGHTS_DIR"]
