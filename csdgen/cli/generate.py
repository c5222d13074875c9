"""``csdgen generate``: images with CSD (or another method) on the built-in model or a checkpoint.

Writes into ``--out``: ``NNNN_<class or prompt>.png`` per image (the name's lower-case words
joined by ``-``, :func:`csdgen.runs.slug`) (the built-in model's 64 x 64
images upscaled x2 by nearest neighbour to 128 x 128; checkpoints at their own size),
``NNNN_<...>_map.png`` (acceptance map, unless ``--no-maps``) and ``record.json``
(:mod:`csdgen.runs`), batch by batch; the same command again resumes.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from . import _options as opt
from ._common import (add_plan, builtin_model, cap_builtin_batch, check_gsd_radii, checkpoint_setup, choose_dtype,
                      clamp_window, fill_defaults, model_defaults, needs_model, note, print_run_line, quantize_setup,
                      refuse_missing_cuda, refuse_static_split, refuse_unfit_tree, require_decoder, sampling_of,
                      split_note, vqgan_setting, writable)

#: options of ``--model`` only (the built-in model refuses them; ``--dtype`` auto / float32 it takes)
MODEL_ONLY = ("prompts", "prompts_file", "layout", "height", "width", "image_size", "negative_prompt", "positive_prompt",
              "prompt_template", "dtype", "vqgan")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("generate", allow_abbrev=False, help="generate images (default: CSD on the built-in model)",
                       description="Generate images with CSD (or another method) on the built-in model (--class) "
                                   "or a Janus, Emu3, Chameleon-format, GLM-Image or Liquid checkpoint (--model, --prompt). Writes "
                                   "NNNN_<class>.png (built-in: 128 x 128, its 64 x 64 images upscaled x2 by nearest "
                                   "neighbour), NNNN_<class>_map.png and record.json into --out; rerun to resume.")
    opt.add_builtin_model(p, n_default="8; with --model one per prompt", batch_default=8, out_default="outputs",
                          checkpoints=True)
    opt.add_method(p)
    opt.add_method_options(p, family_note=True)
    p.add_argument("--refresh", choices=opt.REFRESH_MODES, default=None,
                   help=f"refresh of pending drafts after a rejection, both lossless: independent (SJD's) or coupled "
                        f"(maximal coupling); default: the method's, measured best on the built-in model "
                        f"({', '.join(f'{m} {opt.method_refresh(m)}' for m in opt.METHODS if m != 'ar')})")
    opt.add_preset(p)
    opt.add_rule_options(p)
    p.add_argument("--tree", type=opt.tree_shape, default=None, metavar="K,D",
                   help="draft tree: K candidates at each of the window's first D draft positions, verified exactly "
                        "(default: none; e.g. 3,2; K = 1 is the plain window; docs/frontier.md)")
    opt.add_sampling(p, family_note=True)
    p.add_argument("--no-maps", action="store_true", help="do not write acceptance maps")
    g = p.add_argument_group("checkpoints (--model)")
    g.add_argument("--model", type=opt.model_or_builtin, default=None,
                   help="checkpoint folder or Hugging Face repo id in the local cache (no download); 'builtin' "
                        "(default): the built-in model")
    g.add_argument("--prompt", dest="prompts", action="append", type=opt.prompt_text, default=None, help="text prompt (repeatable)")
    g.add_argument("--prompts-file", type=Path, default=None, help="text file, one prompt per line")
    opt.add_checkpoint_options(g)
    opt.add_quantize(g)
    p.set_defaults(run=run)
    return p


def _rule(args, model=None):
    """The rule ``--method`` names with the options given (a name where the rule's own defaults apply).
    GSD's and LANTERN's need the model's codebook: without ``model`` (before it loads) their name."""
    from csdgen.acceptance import make_rule

    csd = make_rule("csd", lam=args.lam, delta=args.delta, entropy_unit=args.entropy_unit)  # validates early
    if model is not None and args.method == "gsd" and args.gsd_radius is not None:
        check_gsd_radii([args.gsd_radius], model)
        return make_rule("gsd", codebook=model.codebook_embeddings(), radius=args.gsd_radius)
    if model is not None and args.method == "lantern" and args.lantern_delta is not None:
        return make_rule("lantern", codebook=model.codebook_embeddings(), delta=args.lantern_delta)
    return {"csd": csd, "addition": make_rule("addition", c=args.addition_c)}.get(args.method, args.method)


def _generate_kwargs(args, rule, sampling) -> dict:
    kwargs = {"method": rule, "window": args.window, "sampling": sampling, "draft_init": args.draft_init,
              "refresh": args.refresh}
    if args.tree is not None:
        kwargs["tree"] = args.tree
    return {**kwargs, **opt.engine_kwargs(args)}


def _run_settings(args, model, rule, sampling) -> dict:
    """What determines the images (compared on resume), resolved: :func:`csdgen.runs.run_settings`, the
    same as :func:`csdgen.save_run` records, so each resumes the other's folder. Not the batch size: image i
    draws from its own random stream keyed by (seed, i), so a rerun with another --batch-size resumes the
    same images."""
    from csdgen.runs import run_settings

    settings = run_settings(model, seed=args.seed, method=rule, window=args.window, sampling=sampling,
                            draft_init=args.draft_init, refresh=args.refresh, preset=args.preset, tree=args.tree)
    if getattr(args, "quantize", None):  # another target: its images differ (recorded only when given)
        settings["quantize"] = args.quantize
    return settings


def _ar_window(args) -> None:
    """AR decodes one token per forward whatever ``--window`` says: record the window it runs at (1, as
    ``csdgen serve`` reports), with a note when a wider one was given."""
    if args.method == "ar" and args.window != 1:
        if args.window != "auto" and getattr(args, "window_given", True):  # not a preset's window
            note(f"--method ar decodes one token per forward: --window {args.window} does not apply (window 1)")
        args.window = 1


def builtin_job(args):
    """The run plan of the built-in model (``--class``) and its batch size."""
    from csdgen.runs import RunPlan

    given = ["--" + {"prompts": "prompt"}.get(k, k).replace("_", "-") for k in MODEL_ONLY
             if getattr(args, k) is not None and k != "dtype"]  # --dtype: builtin_model's choose_dtype says what it takes
    if given:
        raise ValueError(f"{needs_model(given)} (a checkpoint folder, docs/models.md); "
                         f"the built-in model takes --class")
    model, classes = builtin_model(args)
    _ar_window(args)
    sampling = sampling_of(args)
    rule = _rule(args, model)
    from csdgen.engine import AUTO_MAX_WINDOW

    widest = 1 if args.method == "ar" else AUTO_MAX_WINDOW if args.window == "auto" else args.window
    batch_size = cap_builtin_batch(args, model, widest, sampling.guided, len(classes), tree=args.tree)
    from csdgen.models.plan import builtin_plan

    plan = builtin_plan(model, batch_size=batch_size, window=widest, guided=sampling.guided, quantize=args.quantize,
                        device=model.device, tree=args.tree)
    refuse_unfit_tree(plan)
    add_plan(args, plan)
    settings = _run_settings(args, model, rule, sampling)  # model "builtin", its weights "shipped" or the folder
    from csdgen.runs import slug

    labels = [{"class": model.class_names[c]} for c in classes]
    names = [f"{i:04d}_{slug(label['class'], empty='class')}" for i, label in enumerate(labels)]
    return RunPlan(model, classes, names, labels, settings, _generate_kwargs(args, rule, sampling),
                   scale=model.save_scale), batch_size


def _read_prompts(args) -> list[str]:
    prompts = [p for p in args.prompts or [] if p.strip()]
    if args.prompts_file is not None:
        if args.prompts_file.is_dir():
            raise ValueError(f"--prompts-file {str(args.prompts_file)!r} is a folder; allowed: a text file, one prompt "
                             f"per line")
        if not args.prompts_file.is_file():
            raise FileNotFoundError(f"--prompts-file {str(args.prompts_file)!r} does not exist")
        from csdgen.prompts import read_prompt_text

        text = read_prompt_text(args.prompts_file, "--prompts-file")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if not lines:
            raise ValueError(f"--prompts-file {str(args.prompts_file)!r} holds no prompts; allowed: a text file with "
                             f"one prompt per line")
        prompts += lines
    if not prompts and args.prompts and args.prompts_file is None:
        raise ValueError(f"--prompt {args.prompts[0]!r} is empty; allowed: a prompt with some text (--prompt \"a red "
                         f"apple\"), or --prompts-file FILE (one per line)")
    if not prompts:
        raise ValueError("--model needs prompts: give --prompt \"...\" (repeatable) or --prompts-file FILE (one per line)")
    return prompts


def _known_settings(args, folder, family: str, dtype: str, device: str, prompts: list[str]) -> dict:
    """The part of a ``--model`` run's settings known before the weights are read, as the record keeps
    them (:func:`model_job` records the same values once the model is loaded)."""
    known = {"model": str(args.model), "checkpoint": os.path.realpath(folder), "family": family, "dtype": dtype, "device": device,
             "prompts": prompts, "negative_prompt": args.negative_prompt, "positive_prompt": args.positive_prompt,
             "prompt_template": args.prompt_template, "method": args.method}
    if args.seed is not None:
        known["seed"] = args.seed
    if args.method in ("csd", "addition"):  # their rule's options; GSD's and LANTERN's need the codebook
        known["rule"] = repr(_rule(args))
    known["quantize"] = getattr(args, "quantize", None)  # None: a record without it (refuse_other_record)
    known["vqgan"] = vqgan_setting(args).get("vqgan")  # None: the default decoder, a record without it
    return known


def model_job(args):
    """The run plan of a checkpoint (``--model``) and its batch size."""
    from csdgen.engine import AUTO_MAX_WINDOW
    from csdgen.models.auto import load_model
    from csdgen.models.dtypes import default_device
    from csdgen.models.plan import checkpoint_plan
    from csdgen.runs import RunPlan, refuse_other_record, slug

    from csdgen.models.detect import refuse_builtin_weights

    refuse_builtin_weights(args.model)  # before the prompts and --class: what the folder is explains them
    if args.classes:
        raise ValueError("--class is for the built-in model; with --model give --prompt or --prompts-file")
    prompts = _read_prompts(args)
    folder, family, sampling = checkpoint_setup(args, fixed_window=False)
    rule = _rule(args)
    conditions = [prompts[i % len(prompts)] for i in range(args.num_images or len(prompts))]
    batch_size = min(args.batch_size, len(conditions))
    device = args.device or default_device()
    refuse_missing_cuda(device)
    dtype = choose_dtype(args, family, device)
    quantize_setup(args, device)
    refuse_static_split(args)  # before the weights are read
    # AR decodes one token per forward whatever --window says (_ar_window): its memory is planned at window 1
    widest = 1 if args.method == "ar" else AUTO_MAX_WINDOW if args.window == "auto" else args.window
    refuse_other_record(args.out, _known_settings(args, folder, family, dtype, device, prompts))  # before the weights
    if args.tree is not None:  # before the weights are read: load_model's own check counts a chain window
        refuse_unfit_tree(checkpoint_plan(folder, family, batch_size=batch_size, window=widest, dtype=dtype,
                                          quantize=args.quantize, guided=sampling.guided, device=device, prompt_length=1,
                                          height=args.height, width=args.width, image_size=args.image_size,
                                          tree=args.tree))  # a prompt of 1 token, the window before any clamp to the image
    model = load_model(args.model, dtype=dtype, device=device, layout=args.layout, height=args.height,
                       width=args.width, image_size=args.image_size, batch_size=batch_size,
                       window=widest, guided=sampling.guided,
                       negative_prompt=args.negative_prompt,
                       positive_prompt=args.positive_prompt, prompts=prompts, vqgan=args.vqgan,
                       prompt_template=args.prompt_template, quantize=args.quantize,
                       device_map=args.device_map, need_decoder=True)  # sizes, prompts, memory, decoder files first
    require_decoder(model, str(args.model), folder)  # a Chameleon checkpoint without Chameleon's VQGAN files
    plan = checkpoint_plan(folder, family, batch_size=batch_size, window=min(widest, model.num_image_tokens - 1),
                           dtype=dtype, quantize=args.quantize, guided=sampling.guided, device=device,
                           prompt_length=model.prompt_length(prompts), height=args.height, width=args.width,
                           image_size=args.image_size, tree=args.tree)
    refuse_unfit_tree(plan)  # with the prompts' real length
    add_plan(args, plan)
    split_note(args, model)
    fill_defaults(args, model_defaults(model, family))  # no-op today: the model's own defaults where it carries them
    args.window = clamp_window(args.window, model.num_image_tokens)
    _ar_window(args)
    rule = _rule(args, model)  # GSD's and LANTERN's options need the codebook
    settings = {**_run_settings(args, model, rule, sampling), "model": str(args.model), "checkpoint": os.path.realpath(folder),
                "family": family, "dtype": dtype, "device": device, "grid": list(model.grid), "prompts": prompts,
                "negative_prompt": args.negative_prompt, "positive_prompt": args.positive_prompt,
                "prompt_template": args.prompt_template, **vqgan_setting(args)}
    labels = [{"prompt": p} for p in conditions]
    names = [f"{i:04d}_{slug(p, empty='prompt')}" for i, p in enumerate(conditions)]
    return RunPlan(model, conditions, names, labels, settings, _generate_kwargs(args, rule, sampling), scale=1), batch_size


def run(args) -> int:
    from contextlib import ExitStack

    from ._common import compile_note, list_classes, refuse_file_out

    if args.list_classes is not None:
        if args.model is not None:
            raise ValueError("--list-classes lists the built-in model's classes; with --model give --prompt")
        return list_classes(args)

    from tqdm import tqdm

    from csdgen.folder_lock import refuse_busy
    from csdgen.folder_kinds import refuse_other_kind
    from csdgen.runs import run_plan

    refuse_busy(args.out)  # before the model loads; run_plan takes the lock
    refuse_file_out(args.out)  # before the weights are read (minutes for 7B); writable makes the folder after
    refuse_other_kind(args.out, "run")
    plan, batch_size = model_job(args) if args.model is not None else builtin_job(args)
    out = writable(args.out)
    N = plan.model.num_image_tokens
    state = {"done": 0, "bar": None}
    with ExitStack() as stack:
        def start(todo: int) -> None:  # the folder's record is checked: errors so far came before any bar
            if todo:
                print_run_line(args)  # the run's first line: model, device, dtype and why
                compile_note(args, plan.model.device)
            state["bar"] = stack.enter_context(tqdm(total=todo * N, unit="tok", desc=f"{args.method} W={args.window}",
                                                    leave=False, disable=None))

        def progress(info) -> None:
            done = int(info.committed.sum())
            state["bar"].update(done - state["done"])
            state["done"] = done

        def next_batch(indices) -> None:
            state["done"] = 0

        summary = run_plan(plan, out, batch_size=batch_size, seed=args.seed, maps=not args.no_maps, callback=progress,
                           on_start=start, on_batch=next_batch)
    for line in summary.notes:
        note(line)
    print(summary.line())
    return 0
