"""``csdgen plan``: the memory a run needs, before any weight is read (:mod:`csdgen.models.memory`).

Prints the weights (quantised as ``--quantize`` says), the KV cache, the window buffers, one
forward's activations and their sum (the peak) for ``--batch-size`` images at ``--window``,
against the device's free memory, and the largest batch that fits. A checkpoint's config is read,
not its weights (the model is built on the ``meta`` device); the built-in model is loaded (40 MB).
"""

from __future__ import annotations

import argparse

from . import _options as opt
from ._common import choose_dtype, clamp_window, refuse_missing_cuda

#: the window the plan assumes when none is given: the widest ``window="auto"`` runs
DEFAULT_NOTE = "default: the widest window='auto' runs"
#: csdgen.engine.AUTO_MAX_WINDOW, written here so that the parser does not import torch (a test checks they agree)
AUTO_WIDEST = 32


def plan_window(text: str) -> int | None:
    """``--window``: an integer in 1..1024, or ``auto`` (None: the widest window ``auto`` runs)."""
    if text.strip().lower() == "auto":
        return None
    try:
        return opt.count(maximum=1024)(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or auto") from None


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("plan", allow_abbrev=False, help="the memory a run needs, before the first forward",
                       description="Plan a run's memory before any weight is read: weights (after --quantize), KV "
                                   "cache, window buffers, one forward's activations, their peak, against the device's "
                                   "free memory, and the largest batch that fits.")
    p.add_argument("--model", type=opt.path_text, default="builtin",
                   help="checkpoint folder, cached repo id, or builtin (default)")
    p.add_argument("--weights", type=opt.path_text, default=None,
                   help="built-in model weights folder (default: shipped with csdgen)")
    p.add_argument("--batch-size", type=opt.count(), default=8, metavar="B", help="images decoding together (default 8)")
    p.add_argument("--window", type=plan_window, default=None, metavar="W",
                   help=f"window width, or auto ({DEFAULT_NOTE}, {AUTO_WIDEST}; 1 for AR)")
    p.add_argument("--guidance-scale", type=opt.number, default=None,
                   help="1 plans one row per image (no classifier-free guidance); default: guided, two rows")
    p.add_argument("--prompt-length", type=opt.count(), default=None, metavar="P",
                   help="--model: tokens of the longest prompt row (default 128)")
    p.add_argument("--device", choices=opt.DEVICES, default=None, help="default cuda when available, else cpu")
    opt.add_layout(p)
    p.add_argument("--height", type=opt.count(), default=None, help="--model: image height in pixels")
    p.add_argument("--width", type=opt.count(), default=None, help="--model: image width in pixels")
    p.add_argument("--image-size", type=opt.count(), default=None, help="--model: square image side in pixels")
    opt.add_dtype(p)
    p.add_argument("--quantize", type=opt.one_of(opt.QUANTIZE, "quantisation"), default=None,
                   metavar="{" + ",".join(opt.QUANTIZE) + "}", help="plan the decoder layers quantised so")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    from csdgen.engine import AUTO_MAX_WINDOW
    from csdgen.models.dtypes import default_device

    device = args.device or default_device()
    refuse_missing_cuda(device)
    window = args.window or AUTO_MAX_WINDOW
    if args.guidance_scale is not None:  # as generate checks it (a negative or NaN scale was planned as guided)
        from csdgen.sampling import SamplingConfig

        try:
            SamplingConfig(guidance_scale=args.guidance_scale)
        except ValueError as error:
            raise ValueError(f"--guidance-scale {args.guidance_scale:g}: {str(error).partition(': ')[2]}") from None
    guided = args.guidance_scale is None or args.guidance_scale != 1
    from csdgen.models.quantize import check_in_memory_quantize, check_quantize

    (check_in_memory_quantize if args.model == "builtin" else check_quantize)(args.quantize, device)
    if args.model == "builtin":
        given = [f"--{k.replace('_', '-')}" for k in ("layout", "height", "width", "image_size", "prompt_length")
                 if getattr(args, k) is not None]
        if given:
            from ._common import needs_model

            why = [w for flags, w in ((("--height", "--width", "--image-size"), "has one size"),
                                      (("--prompt-length",), "takes a class, not a prompt"),
                                      (("--layout",), "is not a Chameleon checkpoint")) if set(flags) & set(given)]
            raise ValueError(f"{needs_model(given)} PATH (a checkpoint); the built-in model {' and '.join(why)}")
        from csdgen.models.builtin import load_builtin_model
        from csdgen.models.plan import builtin_plan

        model = load_builtin_model(args.weights, dtype=choose_dtype(args, "builtin", device))
        if args.window is not None:  # generate's note on a window longer than the image, and its window
            window = clamp_window(args.window, model.num_image_tokens)
        plan = builtin_plan(model, batch_size=args.batch_size, window=min(window, model.num_image_tokens),
                            guided=guided, quantize=args.quantize, device=device)
    else:
        if args.weights is not None:
            raise ValueError("--weights is for the built-in model; with --model the checkpoint folder holds the weights")
        from csdgen.models.detect import family_of, model_type_named, model_type_of
        from csdgen.models.dtypes import resolve_dtype
        from csdgen.models.sources import resolve_checkpoint
        from csdgen.models.plan import checkpoint_plan

        folder = resolve_checkpoint(args.model)
        model_type = model_type_of(folder)
        if args.layout is not None and model_type != "chameleon":  # as generate refuses it (it was planned as given)
            raise ValueError(f"--layout {args.layout} applies to Chameleon checkpoints only; {args.model!r} is {model_type_named(model_type)}")
        family = family_of(folder, args.layout, args.model)
        if family == "glm-image" and guided and args.guidance_scale is not None:  # as generate refuses it
            from ._common import refuse_guided_glm_image

            refuse_guided_glm_image(args.guidance_scale)
        if family == "liquid" and args.guidance_scale is not None and args.guidance_scale < 1:
            guided = False  # Liquid decodes a scale below 1 unguided, as its reference does: one row an image
        dtype = resolve_dtype(args.dtype, device, family)[0]
        plan = checkpoint_plan(folder, family, batch_size=args.batch_size, window=window, dtype=dtype,
                               quantize=args.quantize, guided=guided and family != "glm-image", device=device,
                               prompt_length=args.prompt_length, height=args.height, width=args.width,
                               image_size=args.image_size, check_positions=True)
        if args.window is not None and args.window > plan.window:  # generate's note on a window longer than the image
            from ._common import longer_than_image, note

            note(longer_than_image([args.window], plan.window))
    print(plan.table())
    return 0 if plan.fits() else 1  # as test(1): a script can tell a batch that does not fit from the status
