"""Reproducible training of the built-in emoji model (CPU, bfloat16 autocast, fixed seeds).

    python -m csdgen.builtin.train --out RUN --docs RUN/docs

(``ship.py`` then makes a finished run into a weights folder; ``--out`` is a run folder of its own.)

Stages: fetch the emoji (``npm pack``, :mod:`csdgen.builtin.emoji`; ``--classes FILE`` keeps
a subset, e.g. ``csdgen/builtin/classes.json``) -> augmented views ->
train the VQ tokenizer (L1 + edge loss) -> encode views to codes -> train the
class-conditional LlamaForCausalLM on [class, code_0..code_255] -> train the emoji
classifier (on real views and their VQ reconstructions) -> evaluate -> write weights
(safetensors), config.json, metrics.json and the held-out views' classifier-feature statistics
(``reference_features.safetensors``, for the Frechet distance). Each stage ends at its step
count or its wall-clock budget, whichever comes first; finished stages are kept in ``--out``
and reused by a rerun with ``--resume`` (a crash late in training loses only that stage).

``--vq FILE`` reuses a trained tokenizer (no VQ stage); ``--classifier DIR`` takes the classifier
of another model (DIR's config.json and classifier.safetensors) restricted to this model's
classes (its logits of those classes only; no classifier stage). The AR stage checkpoints every
``--ckpt-every`` steps or ``--ckpt-minutes``, whichever comes first, and ``--resume`` continues
it from ``ar.ckpt.pt`` with its optimiser, schedule and batch order.

A subset run on the shipped tokenizer and classifier (the classes the shipped model offers; the
classifier knows those only):

    python -m csdgen.builtin.train --out RUN --resume --classes CLASSES.json \
        --vq csdgen/builtin/weights/vq.safetensors --classifier csdgen/builtin/weights \
        --ar-views 400 --ar-layers 10 --ar-steps 6000 --max-minutes-ar 150

``--resume`` refuses a run folder made with other settings (``stages.json`` keeps them), naming
each difference. Every refusal is one line (``train: error: ...``); Ctrl-C says where to resume.
"""

# Where each part lives: train_common.py (clock, schedule, batches, log), train_files.py (the run
# folder's files, config.json), train_vq.py, train_ar.py and train_classifier.py (the stages),
# train_samples.py (sampling at the end: classifier agreement, --docs grids). This file holds the
# options and main(), the order of the stages and what --resume reuses.

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from . import build_ar_model
from .classifier import CropClassifier
from .emoji import HELDOUT_SEED, TRAIN_SEED, load_emoji, make_views, read_class_list, select_classes
from .train_ar import eval_ar, llama_config_dict, train_ar
from .train_classifier import classify, restricted_classifier, train_classifier
from .train_common import log, to_float
from .train_files import load_module, save_json, save_safetensors, write_config
from .train_samples import SHOWCASE, classifier_agreement, write_sample_grids
from .train_vq import VQ_CONFIG, decode_u8, encode_all, eval_vq, train_vq
from .vq import VQConfig, VQTokenizer
from ..evaluation.quality import REFERENCE_FILE, reference_feature_states

#: the script's options and run, and the names other modules import from here (each defined in the
#: train_*.py module of its stage)
__all__ = ["main", "parse_args", "SHOWCASE", "classify", "decode_u8", "encode_all", "llama_config_dict",
           "restricted_classifier", "save_json", "save_safetensors", "to_float"]


def parse_args(argv=None) -> argparse.Namespace:
    """The options of ``python -m csdgen.builtin.train`` (``argv``: default ``sys.argv[1:]``), with
    ``class_list`` (the names of ``--classes``, or None) and an empty ``done_steps``.

    Exits (argparse's usage error, status 2) when ``--vq`` or ``--ar-init`` is not a file, ``--classifier``
    holds no classifier.safetensors, or ``--classes`` is not a class list."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True,
                   help="the run folder (made; ship.py makes a finished run into a weights folder)")
    p.add_argument("--docs", type=Path, default=None, help="folder for sample/reconstruction PNGs")
    p.add_argument("--resume", action="store_true", help="reuse finished stages found in --out")
    p.add_argument("--ckpt-every", type=int, default=100, help="AR steps between mid-stage checkpoints")
    p.add_argument("--ckpt-minutes", type=float, default=5.0, help="also checkpoint the AR stage this often (0 = only by steps)")
    p.add_argument("--classes", type=Path, default=None,
                   help="JSON list of class names to train on (or an object with one under \"classes\"); default all emoji")
    p.add_argument("--vq", type=Path, default=None, help="reuse this trained vq.safetensors (no VQ stage)")
    p.add_argument("--classifier", type=Path, default=None,
                   help="weights folder whose classifier, restricted to this model's classes, is used (no classifier stage)")
    p.add_argument("--ar-init", type=Path, default=None,
                   help="start the AR stage from these ar.safetensors (same shape), with a fresh schedule")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vq-views", type=int, default=10, help="augmented views per class for the VQ")
    p.add_argument("--ar-views", type=int, default=24, help="augmented views per class for the AR model")
    p.add_argument("--heldout-views", type=int, default=2, help="held-out views per class")
    p.add_argument("--vq-steps", type=int, default=2400)
    p.add_argument("--vq-batch", type=int, default=32)
    p.add_argument("--vq-lr", type=float, default=1e-3)
    p.add_argument("--ar-layers", type=int, default=8)
    p.add_argument("--ar-hidden", type=int, default=256)
    p.add_argument("--ar-intermediate", type=int, default=768)
    p.add_argument("--ar-heads", type=int, default=8)
    p.add_argument("--ar-steps", type=int, default=3000)
    p.add_argument("--ar-batch", type=int, default=32)
    p.add_argument("--ar-lr", type=float, default=1.5e-3)
    p.add_argument("--cls-steps", type=int, default=1200)
    p.add_argument("--cls-batch", type=int, default=128)
    p.add_argument("--cls-lr", type=float, default=2e-3)
    p.add_argument("--cls-width", type=int, default=48)
    p.add_argument("--cls-recon-views", type=int, default=8, help="VQ reconstructions per class in the classifier's data")
    p.add_argument("--cls-features", type=int, default=256)
    p.add_argument("--guidance", type=float, default=3.0)
    p.add_argument("--agreement-samples", type=int, default=256, help="guided samples for the classifier agreement")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-minutes-vq", type=float, default=40.0, help="wall budget (0 = none)")
    p.add_argument("--max-minutes-ar", type=float, default=150.0, help="wall budget (0 = none)")
    p.add_argument("--max-minutes-cls", type=float, default=20.0, help="wall budget (0 = none)")
    args = p.parse_args(argv)
    for name in ("vq_views", "ar_views", "heldout_views", "vq_steps", "vq_batch", "ar_layers", "ar_hidden",
                 "ar_intermediate", "ar_heads", "ar_steps", "ar_batch", "cls_steps", "cls_batch", "cls_width",
                 "cls_features", "agreement_samples", "log_every", "threads", "ckpt_every"):
        if getattr(args, name) < 1:  # --ar-steps 0 wrote untrained weights and said done
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: allowed an integer >= 1")
    if args.ar_hidden % args.ar_heads:
        p.error(f"--ar-hidden {args.ar_hidden}: allowed a multiple of --ar-heads ({args.ar_heads})")
    for name in ("vq", "ar_init"):
        path = getattr(args, name)
        if path is not None and not path.is_file():
            p.error(f"--{name.replace('_', '-')} {path}: no such file")
    if args.classifier is not None and not (args.classifier / "classifier.safetensors").is_file():
        p.error(f"--classifier {args.classifier}: no classifier.safetensors there")
    if args.classes is not None:
        try:
            args.class_list = read_class_list(args.classes)
        except ValueError as exc:
            p.error(str(exc))
    else:
        args.class_list = None
    args.done_steps = {}
    return args


#: options that do not change what a run trains (compared by --resume: every other one must match)
NOT_COMPARED = ("out", "docs", "resume", "threads", "log_every", "ckpt_every", "ckpt_minutes", "max_minutes_vq",
                "max_minutes_ar", "max_minutes_cls", "guidance", "agreement_samples", "class_list", "done_steps")


def run_settings(args: argparse.Namespace) -> dict:
    """What decides a run's data and models, as ``stages.json`` keeps it: every option but
    :data:`NOT_COMPARED`, paths as text, ``--classes`` as its names."""
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in NOT_COMPARED}
    settings["classes"] = args.class_list
    return settings


def main(argv=None) -> None:
    """The command line: :func:`run` with every refusal as one line (``train: error: ...``, status 1)
    and Ctrl-C as a line saying how to resume (status 130)."""
    import signal
    import sys

    stopped_by = []

    def on_sigterm(signum, frame):  # SIGTERM stops it as Ctrl-C does, with the same line (status 143)
        stopped_by.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        run(argv)
    except (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError) as exc:
        raise SystemExit(f"train: error: {exc}") from None
    except KeyboardInterrupt:
        print("train: interrupted; the stages finished and the AR stage's last checkpoint are kept: rerun the same "
              "command with --resume to continue", file=sys.stderr, flush=True)
        raise SystemExit(143 if stopped_by else 130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(argv=None) -> None:
    """Run the training (:func:`parse_args`' options): data, VQ, AR and classifier stages, the samples,
    and write the weights folder ``--out`` (vq/ar/classifier.safetensors, config.json, metrics.json,
    reference_features.safetensors; stages.json, codes.tmp.pt and ar.ckpt.pt for ``--resume``).

    Raises:
        ValueError: ``--out`` is a file; ``--resume`` of a run folder made with other settings (naming each
            difference); a ``--vq``, ``--classifier`` or ``--ar-init`` file that does not fit.
        SystemExit: a ``--classes`` name is not an emoji (one line)."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {str(args.out)!r} is a file; allowed: a folder (made where missing)")
    args.out.mkdir(parents=True, exist_ok=True)
    stage_file = args.out / "stages.json"
    if not args.resume and (stage_file.is_file() or (args.out / "ar.ckpt.pt").is_file()):
        raise ValueError(f"--out {str(args.out)!r} holds a run (its stages.json or AR checkpoint): --resume continues it; "
                         f"another --out, or that folder deleted, starts over")
    stages = json.loads(stage_file.read_text()) if args.resume and stage_file.is_file() else {}
    settings = run_settings(args)
    if "settings" in stages and stages["settings"] != settings:  # a run of other options: its stages do not fit
        was = stages["settings"]
        differ = [f"--{k.replace('_', '-')} {was.get(k)!r} there, {v!r} now" for k, v in settings.items() if was.get(k) != v]
        raise ValueError(f"--resume: {str(args.out)!r} holds a run made with other settings ({'; '.join(differ)}); "
                         f"give the run's own settings, or another --out")
    stages["settings"] = settings
    times, metrics = dict(stages.get("times", {})), dict(stages.get("metrics", {}))
    args.done_steps = dict(stages.get("done_steps", {}))

    def finish(stage: str) -> None:
        stages.setdefault("done", []).append(stage)
        stages.update(times=times, metrics=metrics, done_steps=args.done_steps)
        save_json(stages, stage_file)

    t = time.time()
    data = load_emoji()
    all_names = list(data.names)
    if args.class_list is not None:
        try:
            data = select_classes(data, args.class_list)
        except ValueError as exc:  # one line naming the file and the closest names, no traceback
            raise SystemExit(f"--classes {args.classes}: {exc}") from None
    num_classes = len(data.names)
    xvq = make_views(data, args.vq_views, TRAIN_SEED + 1, uint8=True)[0] if args.vq is None else None
    xtr, ytr = make_views(data, args.ar_views, TRAIN_SEED, uint8=True)
    xho, yho = make_views(data, args.heldout_views, HELDOUT_SEED, uint8=True)
    times["data_s"] = time.time() - t
    log(f"data: {num_classes} classes, {len(data.images)} images; vq {None if xvq is None else tuple(xvq.shape)} "
        f"ar {tuple(xtr.shape)} heldout {tuple(xho.shape)}")
    done = set(stages.get("done", []))

    if args.vq is not None and "vq" not in done:  # a resumed run keeps its own copy
        vq = load_module(VQTokenizer(VQConfig(**VQ_CONFIG)), args.vq)
        save_safetensors(vq.state_dict(), args.out / "vq.safetensors", dtype=torch.float16)
        log(f"vq: from {args.vq}")
    elif "vq" in done:
        vq = load_module(VQTokenizer(VQConfig(**VQ_CONFIG)), args.out / "vq.safetensors")
        log("vq: reused")
    else:
        t = time.time()
        vq = train_vq(xvq, args)
        times["vq_train_s"] = time.time() - t
        save_safetensors(vq.state_dict(), args.out / "vq.safetensors", dtype=torch.float16)
    vq = vq.float().eval()
    codes_file = args.out / "codes.tmp.pt"
    if "vq" in done and codes_file.is_file():
        ctr, cho = torch.load(codes_file)
    else:
        t = time.time()
        ctr, cho = encode_all(vq, xtr), encode_all(vq, xho)
        times["encode_s"] = time.time() - t
        torch.save((ctr, cho), codes_file)
        metrics["vq"] = eval_vq(vq, xho, ctr)
        log(f"vq metrics {metrics['vq']}")
        finish("vq")

    llama_cfg = llama_config_dict(num_classes, args.ar_layers, args.ar_hidden, args.ar_intermediate, args.ar_heads)
    clf = None
    clf_cfg = {"num_classes": num_classes, "width": args.cls_width, "feature_dim": args.cls_features}
    if "cls" in done and "classifier_config" in stages:  # a resumed run keeps its own copy
        clf_cfg = stages["classifier_config"]
        clf = load_module(CropClassifier(**clf_cfg), args.out / "classifier.safetensors")
    elif args.classifier is not None:  # no classifier stage: written before the AR stage
        clf, clf_cfg = restricted_classifier(args.classifier, data.names, all_names)
        stages["classifier_config"] = clf_cfg
        if "cls" not in done:
            save_safetensors(clf.state_dict(), args.out / "classifier.safetensors", dtype=torch.float16)
            recon_ho = decode_u8(vq, cho)
            metrics["classifier"] = {
                "source": f"{args.classifier}'s classifier, its logits of these {num_classes} classes",
                "heldout_accuracy": float((classify(clf, xho) == yho).float().mean()),
                "heldout_accuracy_vq_reconstructions": float((classify(clf, recon_ho) == yho).float().mean()),
                "n_heldout": len(yho)}
            log(f"classifier metrics {metrics['classifier']}")
            finish("cls")
    if clf is not None:  # config.json before the AR stage: its checkpoints can be measured meanwhile
        write_config(args.out, args, llama_cfg, vq, clf_cfg, data.names, data.categories, data.short_names)

    if "ar" in done:
        ar = load_module(build_ar_model(llama_cfg), args.out / "ar.safetensors")
        log("ar: reused")
    else:
        t = time.time()
        ar = train_ar(ctr, ytr, llama_cfg, args)
        times["ar_train_s"] = time.time() - t
        save_safetensors(ar.state_dict(), args.out / "ar.safetensors", dtype=torch.float16)
        ar = load_module(build_ar_model(llama_cfg), args.out / "ar.safetensors")  # as shipped (fp16)
        metrics["ar"] = eval_ar(ar, cho, yho) | {"params": sum(p.numel() for p in ar.parameters())}
        log(f"ar metrics {metrics['ar']}")
        finish("ar")

    if clf is None and "cls" in done:
        clf = load_module(CropClassifier(**clf_cfg), args.out / "classifier.safetensors")
    elif clf is None:
        # real views plus their VQ reconstructions, so the classifier judges shapes, not VQ blur
        t = time.time()
        n_rec = min(len(ctr), num_classes * args.cls_recon_views)
        recon = decode_u8(vq, ctr[:n_rec])
        xcls, ycls = torch.cat([xtr, recon]), torch.cat([ytr, ytr[:n_rec]])
        clf = train_classifier(xcls, ycls, num_classes, args)
        times["cls_train_s"] = time.time() - t
        save_safetensors(clf.state_dict(), args.out / "classifier.safetensors", dtype=torch.float16)
        clf = clf.eval()
        recon_ho = decode_u8(vq, cho)
        metrics["classifier"] = {
            "heldout_accuracy": float((classify(clf, xho) == yho).float().mean()),
            "heldout_accuracy_vq_reconstructions": float((classify(clf, recon_ho) == yho).float().mean()),
            "n_heldout": len(yho)}
        log(f"classifier metrics {metrics['classifier']}")
        finish("cls")
    write_config(args.out, args, llama_cfg, vq, clf_cfg, data.names, data.categories, data.short_names)
    save_safetensors(reference_feature_states(clf.eval(), to_float(xho)), args.out / REFERENCE_FILE)

    t = time.time()
    metrics["samples"] = classifier_agreement(ar, vq, clf, num_classes, args.agreement_samples, args.guidance, args.seed)
    if args.docs is not None:
        write_sample_grids(ar, vq, data.names, xho, yho, args.guidance, args.seed, args.docs)
    times["sample_s"] = time.time() - t
    times["total_s"] = sum(v for k, v in times.items() if k != "total_s")
    metrics["wall_times_s"] = times
    metrics["steps_done"] = dict(args.done_steps)
    metrics["sizes_bytes"] = {p.name: p.stat().st_size for p in sorted(args.out.glob("*.safetensors"))}
    total = sum(metrics["sizes_bytes"].values())
    if total > 25e6:
        log(f"warning: the weights take {total / 1e6:.1f} MB, over the 25 MB budget")
    save_json(metrics, args.out / "metrics.json")
    log(f"done: {json.dumps(metrics)}")


if __name__ == "__main__":
    main()
