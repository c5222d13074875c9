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

import json
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


def _load_state(path: Path) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in load_file(str(path)).items()}


def load_components(weights_dir: str | os.PathLike | None = None) -> BuiltinComponents:
    """Load VQ tokenizer, Llama AR model, classifier and config.json (offline)."""
    wdir = Path(weights_dir) if weights_dir is not None else DEFAULT_WEIGHTS_DIR
    if not wdir.is_dir():  # a mistyped --weights: training is not the advice
        raise FileNotFoundError(f"no built-in weights in {wdir}: no such folder; give the folder that holds config.json "
                                f"and the .safetensors files (or leave --weights out for the shipped weights)")
    if not (wdir / "config.json").is_file():
        raise FileNotFoundError(f"no built-in weights in {wdir}; run python -m csdgen.builtin.train")
    config = json.loads((wdir / "config.json").read_text())
    vq = VQTokenizer(VQConfig(**config["vq"]))
    vq.load_state_dict(_load_state(wdir / "vq.safetensors"))
    ar = build_ar_model(config["llama"])
    ar.load_state_dict(_load_state(wdir / "ar.safetensors"))
    classifier = CropClassifier(**config["classifier"])
    classifier.load_state_dict(_load_state(wdir / "classifier.safetensors"))
    return BuiltinComponents(vq=vq.float().eval(), ar=ar.float().eval(),
                             classifier=classifier.float().eval(), config=config, weights_dir=wdir)


__all__ = ["BuiltinComponents", "CropClassifier", "VQConfig", "VQTokenizer",
           "build_ar_model", "load_components", "DEFAULT_WEIGHTS_DIR"]
