"""The classifier stage of the built-in model's training (:mod:`csdgen.builtin.train`): train the
emoji classifier (real views and VQ reconstructions, half of each batch blurred), classify
images, and the classifier of another model restricted to this model's classes (``--classifier``).

Training-time only (never imported at run time).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from .classifier import CropClassifier
from .train_common import StageClock, autocast, batch_indices, cosine_lr, log, set_lr, to_float


def train_classifier(images: torch.Tensor, labels: torch.Tensor, num_classes: int, args) -> CropClassifier:
    """Train the emoji classifier on uint8 views [N, 3, 64, 64] with labels int64 [N] in
    ``0 .. num_classes - 1`` (cross-entropy, AdamW, cosine; a random half of each batch blurred by
    a 2x down-up resize, as generated images are softer); returns it in eval mode.

    ``args``: train.py's options (``seed``, ``cls_width``, ``cls_features``, ``cls_lr``,
    ``cls_steps``, ``cls_batch``, ``max_minutes_cls``, ``threads``, ``log_every``); the steps run
    are recorded in ``args.done_steps["cls"]``."""
    torch.manual_seed(args.seed + 4)
    clf = CropClassifier(num_classes=num_classes, width=args.cls_width, feature_dim=args.cls_features).train()
    opt = torch.optim.AdamW(clf.parameters(), lr=args.cls_lr, weight_decay=1e-4)
    gen = torch.Generator().manual_seed(args.seed + 5)
    clock = StageClock("cls", args.cls_steps, args.max_minutes_cls, args.threads)
    for step, idx in enumerate(batch_indices(len(images), args.cls_batch, args.cls_steps, args.seed + 6)):
        if clock.progress(step) >= 1.0:
            break
        clock.tick(step)
        args.done_steps["cls"] = step + 1
        set_lr(opt, cosine_lr(clock.progress(step), args.cls_lr, warmup=0.05))
        x = to_float(images[idx])
        blur = torch.rand(len(idx), generator=gen) < 0.5
        soft = F.interpolate(F.avg_pool2d(x, 2), scale_factor=2, mode="bilinear", align_corners=False)
        x = torch.where(blur[:, None, None, None], soft, x)
        with autocast():
            logits = clf(x)
        loss = F.cross_entropy(logits.float(), labels[idx], label_smoothing=0.05)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % args.log_every == 0 or step == args.cls_steps - 1:
            log(f"cls step {step} loss {loss.item():.4f}")
    return clf.eval()


@torch.no_grad()
def classify(clf: CropClassifier, images: torch.Tensor, batch: int = 200) -> torch.Tensor:
    """images uint8 or float [N, 3, 64, 64] -> predicted class indices int64 [N]."""
    conv = to_float if images.dtype == torch.uint8 else (lambda x: x)
    return torch.cat([clf(conv(images[i:i + batch])).argmax(-1) for i in range(0, len(images), batch)])


def restricted_classifier(folder: Path, names: list[str], all_names: list[str]) -> tuple[CropClassifier, dict]:
    """The classifier of the weights in ``folder`` restricted to the classes ``names``: the same
    trunk, the head's rows of those classes only (so its argmax is the full classifier's argmax
    among them). Source class names: ``folder``'s config.json ``class_names``, else ``all_names``.

    Returns (classifier float32 eval, its config dict). Raises ValueError: a name is not one of
    the source classifier's classes.
    """
    from safetensors.torch import load_file

    cfg_file = folder / "config.json"
    src = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    src_names = src.get("class_names", all_names)
    src_cfg = src.get("classifier", {"num_classes": len(src_names), "width": 48, "feature_dim": 256})
    missing = [n for n in names if n not in src_names]
    if missing:
        raise ValueError(f"--classifier {folder}: classes not in its classifier: {missing[:5]}")
    state = {k: v.float() for k, v in load_file(str(folder / "classifier.safetensors")).items()}
    rows = torch.tensor([src_names.index(n) for n in names])
    head = [k for k in state if k.startswith("head.") and state[k].shape[0] == len(src_names)]
    for k in head:
        state[k] = state[k][rows].contiguous()
    cfg = dict(src_cfg, num_classes=len(names))
    clf = CropClassifier(**cfg)
    clf.load_state_dict(state)
    return clf.eval(), cfg
