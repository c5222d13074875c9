"""The files of a training run of the built-in model (:mod:`csdgen.builtin.train`): atomic
safetensors and JSON writes, reading a stage's weights back, and the run's ``config.json`` (the
layout :func:`csdgen.builtin.load_components` reads).

Training-time only (never imported at run time).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from .emoji import HELDOUT_SEED, TRAIN_SEED
from .train_common import CODEBOOK_SIZE
from .vq import VQTokenizer


def save_safetensors(state: dict[str, torch.Tensor], path: Path, dtype=None) -> None:
    """Atomic write of a state dict (optionally cast floating tensors to ``dtype``)."""
    out = {}
    for k, v in state.items():
        v = v.detach().cpu()
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        out[k] = v.contiguous()
    tmp = path.with_suffix(path.suffix + ".tmp")
    save_file(out, str(tmp))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def save_json(obj: dict, path: Path) -> None:
    """Atomic JSON write."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def write_config(out: Path, args, llama_cfg: dict, vq: VQTokenizer, clf_cfg: dict,
                 names: list[str], categories: list[str], short_names: list[list[str]]) -> None:
    """Write ``out/config.json`` (atomic): the token layout (codebook, class tokens, null class),
    the class names, categories and short names, the VQ, Llama and classifier configs, and the
    training options ``args`` (all but ``out``, ``docs``, ``resume`` and ``class_list``) with the
    data seeds; with ``--classes``, the class list's file name and its ``"how"``."""
    config = {
        "format_version": 2,
        "data": "emoji-datasource-google 16.0.0 (Noto emoji, Apache-2.0), 64 x 64 on white",
        "image_size": 64, "grid": list(vq.grid), "codebook_size": CODEBOOK_SIZE,
        "class_names": list(names), "class_categories": list(categories),
        "class_short_names": [list(s) for s in short_names], "num_classes": len(names),
        "class_token_offset": CODEBOOK_SIZE, "null_class_id": CODEBOOK_SIZE + len(names),
        "sequence": "[class_token, code_0 .. code_255], raster order",
        "vq": vq.config.to_dict(), "llama": llama_cfg, "classifier": clf_cfg,
        "ar_dtype_on_disk": "float16",
        "training": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                     if k not in ("out", "docs", "resume", "class_list")}
        | {"data_seeds": {"train": TRAIN_SEED, "heldout": HELDOUT_SEED}, "cond_dropout": 0.1},
    }
    if getattr(args, "class_list", None) is not None:
        how = json.loads(Path(args.classes).read_text())
        config["class_set"] = {"file": Path(args.classes).name,
                               "how": how.get("how", "") if isinstance(how, dict) else ""}
    save_json(config, out / "config.json")


def load_module(module: torch.nn.Module, path: Path) -> torch.nn.Module:
    """``module`` with the tensors of the safetensors file ``path`` loaded as float32, in eval mode
    (returned; strict: the names and shapes must be the module's).

    Raises:
        ValueError: the file's names or shapes are not the module's (one line, counting them)."""
    from safetensors.torch import load_file

    state = {k: v.float() for k, v in load_file(str(path)).items()}
    own = module.state_dict()
    missing, unexpected = [k for k in own if k not in state], [k for k in state if k not in own]
    shapes = [k for k in own if k in state and own[k].shape != state[k].shape]
    if missing or unexpected or shapes:  # one line, not load_state_dict's list of every key
        first = (f"{shapes[0]!r} is {tuple(state[shapes[0]].shape)} there, {tuple(own[shapes[0]].shape)} here" if shapes
                 else f"{(missing or unexpected)[0]!r} {'missing' if missing else 'not expected'}")
        raise ValueError(f"{str(path)!r} does not fit this model ({len(missing)} tensors missing, {len(unexpected)} not "
                         f"expected, {len(shapes)} of another shape; {first}): other layer, width or class options?")
    module.load_state_dict(state)
    return module.eval()
