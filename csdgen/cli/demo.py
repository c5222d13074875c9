"""``csdgen demo``: a local web page to watch AR, SJD, CSD, ... decode side by side (:mod:`csdgen.demo`).

Serves on ``--host`` (default 127.0.0.1, this machine only) and ``--port`` (default: the first
free port from 7860; 0: any free port) until interrupted. gradio and torch are imported by :func:`run` only, so
``csdgen --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("demo", allow_abbrev=False, help="a local web page to watch AR, SJD, CSD, ... decode side by side",
                       description="Serve a local page that runs the chosen methods on one seed and shows each image, "
                                   "its acceptance map and its entropy map filling in, then forwards, step compression "
                                   "and wall time per method (CSV download). Nothing is downloaded.")
    from . import _options as opt

    p.add_argument("--model", type=opt.model_or_builtin, default=None,
                   help="checkpoint folder or cached repo id; 'builtin' (default): the built-in model")

    p.add_argument("--weights", type=opt.path_text, default=None,
                   help="built-in model weights folder (default: shipped with csdgen)")
    opt.add_layout(p)
    opt.add_checkpoint_files(p)
    opt.add_dtype(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=opt.port(0), default=None,
                   help="TCP port (default: the first free one from 7860; 0: any free port, as csdgen serve)")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    from csdgen.interrupts import restore_ctrl_c

    restore_ctrl_c()  # a background job of a script (`csdgen demo &`): Ctrl-C stops it, its imports included
    from csdgen.demo import serve

    from ._common import choose_dtype, needs_model, print_run_line, refuse_builtin_layout

    if args.model is not None and args.weights is not None:
        raise ValueError("--weights is for the built-in model; with --model the checkpoint folder holds the weights")
    if args.model is None:
        refuse_builtin_layout(args.layout)
    if args.model is None and (args.image_size is not None or args.vqgan is not None):
        given = [flag for flag, value in (("--image-size", args.image_size), ("--vqgan", args.vqgan)) if value is not None]
        raise ValueError(f"{needs_model(given)} (a checkpoint); the built-in model has one size and its own VQ decoder")
    if args.model is None:
        dtype = choose_dtype(args, "builtin", "cpu")  # the built-in model runs where it loads
    else:
        from csdgen.models.detect import family_of
        from csdgen.models.dtypes import default_device
        from csdgen.models.sources import resolve_checkpoint

        dtype = choose_dtype(args, family_of(resolve_checkpoint(args.model), args.layout, args.model), default_device())
    # the first line once the model is loaded and checked: model, device, dtype and why
    serve(args.model, host=args.host, port=args.port, weights=args.weights, image_size=args.image_size, vqgan=args.vqgan,
          layout=args.layout, dtype=dtype, on_loaded=lambda: print_run_line(args, file=sys.stdout))
    return 0
