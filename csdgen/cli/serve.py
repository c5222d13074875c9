"""``csdgen serve``: an OpenAI-compatible image server with continuous batching (:mod:`csdgen.serve`).

Loads one model (the built-in one, or ``--model``), binds ``--host`` (default 127.0.0.1, this
machine only) and ``--port`` (default 8000; 0 = any free port), prints its address line and
serves until interrupted. The method and sampling options are the defaults of requests that
leave those fields out. FastAPI, uvicorn and torch are imported by :func:`run` only.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import _options as opt
from ._common import choose_dtype, refuse_missing_cuda

BATCHING = ("continuous", "static")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's (csdgen.serve.logs.LOG_LEVELS)


def _gib(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of GiB > 0") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value}: expected a number of GiB > 0")
    return value


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", allow_abbrev=False, help="an OpenAI-compatible image server with continuous batching",
                       description="Serve one model over HTTP: POST /v1/images/generations (OpenAI's Images API; "
                                   "csdgen's method, window, seed, ... in the same body), GET /v1/models, GET /health, "
                                   "GET /metrics (Prometheus). Requests share forwards: waiting images join the running "
                                   "batch at every iteration (docs/serve.md).")
    p.add_argument("--model", type=opt.model_or_builtin, default=None,
                   help="checkpoint folder or cached repo id, or 'builtin' (default: the built-in model)")
    p.add_argument("--weights", type=opt.path_text, default=None, help="built-in model weights folder (default: shipped with csdgen)")
    p.add_argument("--served-name", type=_served_name, default=None, metavar="NAME",
                   help="the model name requests give (default: csdgen-builtin, or the --model value)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=opt.port(0), default=8000, help="TCP port (default 8000; 0: any free port)")
    p.add_argument("--max-batch", type=opt.count(), default=None, metavar="B",
                   help=f"most images decoding together (default: on cuda the largest batch the memory plan fits, "
                        f"csdgen plan; on cpu and with --replicas {CPU_MAX_BATCH}; lowered to what memory allows)")
    p.add_argument("--max-queue", type=opt.count(), default=256, metavar="Q",
                   help="most images waiting; requests beyond get 429 with Retry-After (default 256)")
    p.add_argument("--max-images", type=opt.count(), default=10, metavar="N",
                   help="most images per request; more get 413 (default 10, as OpenAI's n)")
    p.add_argument("--batching", choices=BATCHING, default="continuous",
                   help="continuous (default: images join the running batch at every iteration) or static "
                        "(a batch filled, run to its end, then the next: for comparison)")
    p.add_argument("--warmup", action="store_true",
                   help="compile (and on cuda capture as CUDA graphs) the static engine's step shapes before serving, "
                        "for the default request settings (the prompt bucket of a short prompt); prints how many and "
                        "how long. Nothing to do where the engine runs uncompiled (the default on cpu; --compile compiles there too)")
    p.add_argument("--max-memory", type=_gib, default=None, metavar="GIB",
                   help="memory the model and its batch may use, in GiB (default: what the device has free); the "
                        "memory plan (csdgen plan) says how many images fit and the batch admits at most that many")
    p.add_argument("--partial-every", type=opt.count(), default=8, metavar="F",
                   help="streamed requests without partial_images: a partial image every F forwards (default 8)")
    p.add_argument("--device", choices=opt.DEVICES, default=None, help="default cpu; with --model cuda when available")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                   help="of csdgen's log lines and uvicorn's (default info: a start-up line, an access line per image "
                        "request on stdout, shutdown lines; warning: errors and warnings only)")
    opt.add_dtype(p)
    opt.add_quantize(p)
    opt.add_layout(p)
    p.add_argument("--height", type=opt.count(), default=None, help="--model: image height in pixels")
    p.add_argument("--width", type=opt.count(), default=None, help="--model: image width in pixels")
    opt.add_checkpoint_files(p)
    p.add_argument("--negative-prompt", type=opt.prompt_text, default=None,
                   help="--model, Emu3: prompt of the unconditional rows (default Emu3's own)")
    p.add_argument("--positive-prompt", type=opt.prompt_text, default=None,
                   help="--model, Emu3: text appended to every prompt (default Emu3's; '' = off)")
    p.add_argument("--prompt-template", type=opt.prompt_text, default=None, help="--model: template with {prompt}, {width}, {height}")
    r = p.add_argument_group("replicas on Ray Serve (pip install -c constraints.txt \".[ray]\"; docs/serve.md)")
    r.add_argument("--replicas", type=opt.count(maximum=1024), default=None, metavar="N",
                   help="start a local Ray and serve N replicas behind Ray Serve's HTTP proxy on --host/--port, each "
                        "one scheduler owning one model and one device (a GPU each where Ray sees GPUs); Ray places, "
                        "routes, health-checks (GET /health) and restarts them. Default: one server in this process")
    r.add_argument("--max-replicas", type=opt.count(maximum=1024), default=None, metavar="M",
                   help="with --replicas N: Ray Serve autoscales between N and M replicas by ongoing requests per "
                        "replica (target: --max-batch)")
    r.add_argument("--replica-cpus", type=opt.count(maximum=1024), default=None, metavar="C",
                   help="with --replicas N: CPUs Ray reserves for each replica (default 1; its torch threads)")
    g = p.add_argument_group("request defaults (a request's own fields win)")
    opt.add_method(g)
    opt.add_method_options(g, family_note=True, served=True)
    opt.add_rule_options(g)
    g.add_argument("--refresh", choices=opt.REFRESH_MODES, default=None,
                   help="refresh of pending drafts (default: the method's, as csdgen.generate: coupled for SJD and "
                        "CSD, independent for the others; coupled = maximal coupling)")
    opt.add_sampling(g, family_note=True)
    p.set_defaults(run=run)
    return p


#: ``--max-batch`` on a CPU when none is given (on CUDA: the memory plan's largest batch)
CPU_MAX_BATCH = 16
#: the most a memory plan sets ``--max-batch`` to on its own
PLAN_MAX_BATCH = 256


def _load(args):
    """``(model, name, aliases, plan)``: the model, its served name and aliases, its memory plan (whose
    largest batch is how many images its memory holds)."""
    from csdgen.engine import AUTO_MAX_WINDOW

    budget = None if args.max_memory is None else int(args.max_memory * 2**30)
    if args.model is None:
        prompts = [f"--{k.replace('_', '-')}" for k in ("negative_prompt", "positive_prompt", "prompt_template")
                   if getattr(args, k) is not None]
        if prompts:
            from ._common import needs_model

            raise ValueError(f"{needs_model(prompts)} (a checkpoint); the built-in model takes class names, not text "
                             f"prompts")
        given = [f"--{k.replace('_', '-')}" for k in ("layout", "height", "width", "image_size", "vqgan")
                 if getattr(args, k) is not None]
        # --dtype: choose_dtype below says what the built-in model takes
        if given:
            from ._common import needs_model

            raise ValueError(f"{needs_model(given)} (a checkpoint); the built-in model has one size and its own VQ "
                             f"decoder")
        from csdgen.models.builtin import load_builtin_model

        device = args.device or "cpu"
        refuse_missing_cuda(device)
        dtype = choose_dtype(args, "builtin", device)
        from ._common import quantize_setup, refuse_builtin_device_map
        from csdgen.models.plan import builtin_plan

        refuse_builtin_device_map(args)
        quantize_setup(args, device)
        model = load_builtin_model(args.weights, quantize=args.quantize, device=device, dtype=dtype)
        plan = builtin_plan(model, batch_size=args.max_batch or CPU_MAX_BATCH, window=AUTO_MAX_WINDOW, guided=True,
                            quantize=args.quantize, device=model.device, free=budget)
        return model, "csdgen-builtin", ("builtin",), plan
    if args.weights is not None:
        raise ValueError("--weights is for the built-in model; with --model the checkpoint folder holds the weights")
    from pathlib import Path

    from ._common import require_decoder
    from csdgen.models.auto import load_model

    folder, family, device, dtype = _checkpoint_checks(args)
    from ._common import split_note
    from csdgen.models.plan import checkpoint_plan

    model = load_model(args.model, dtype=dtype, device=device, layout=args.layout, height=args.height, width=args.width,
                       image_size=args.image_size, batch_size=1, window=AUTO_MAX_WINDOW, guided=True,
                       prompt_template=args.prompt_template, negative_prompt=args.negative_prompt,
                       positive_prompt=args.positive_prompt, vqgan=args.vqgan, max_memory_bytes=budget,
                       quantize=args.quantize, device_map=args.device_map, need_decoder=True)
    require_decoder(model, str(args.model), folder)  # a Chameleon checkpoint without Chameleon's VQGAN files
    split_note(args, model)
    guided = family != "glm-image"
    plan = checkpoint_plan(folder, family, batch_size=args.max_batch or CPU_MAX_BATCH,
                           window=min(AUTO_MAX_WINDOW, model.num_image_tokens - 1), dtype=dtype, quantize=args.quantize,
                           guided=guided, device=device, free=budget, height=args.height, width=args.width,
                           image_size=args.image_size)
    return model, str(args.model), (Path(str(args.model)).name,), plan


def _checkpoint_checks(args) -> tuple:
    """``(folder, family, device, dtype)`` of ``--model``: what :func:`_load` checks before any weight is read
    (the checkpoint found, its family and tokenizer files, the device, the dtype and --quantize for the device).

    Raises:
        ValueError: one line naming the option.
    """
    from ._common import quantize_setup, refuse_static_split
    from csdgen.models.detect import family_of, read_config
    from csdgen.models.dtypes import default_device
    from csdgen.models.sources import resolve_checkpoint

    from csdgen.models.auto import check_tokenizer_files

    folder = resolve_checkpoint(args.model)
    read_config(folder)
    family = family_of(folder, args.layout, args.model)
    check_tokenizer_files(folder, family)  # requests are text: refused here, naming the folder, before the weights
    device = args.device or default_device()
    refuse_missing_cuda(device)
    dtype = choose_dtype(args, family, device)
    quantize_setup(args, device)
    refuse_static_split(args)  # before the weights are read, as generate and bench refuse it
    return folder, family, device, dtype


def _served_name(text: str) -> str:
    """``--served-name``: a non-empty name without surrounding spaces (requests give it as ``model``)."""
    if not text.strip() or text != text.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: allowed a non-empty model name without surrounding spaces, "
                                         f"e.g. csdgen-builtin (leave the option out for the default)")
    return text


def _warmup(model, request, capacity: int, engine_kwargs: dict | None = None) -> None:
    """``--warmup``: the static engine's compiled steps for batches up to ``capacity`` images, the
    default request's guidance and window (every width bucket up to it; ``auto``: up to its widest)."""
    from csdgen.engine import AUTO_MAX_WINDOW
    from csdgen.models._static import static_refusal
    from csdgen.models._static_warmup import warmup

    kwargs = request.batch_kwargs
    window = kwargs.get("window")
    window = AUTO_MAX_WINDOW if window in (None, "auto") else int(window)
    window = max(1, min(window, model.num_image_tokens - 1))
    engine_kwargs = engine_kwargs or {}
    if engine_kwargs.get("engine") == "eager" or \
            static_refusal(model.start([request.condition], 1, kwargs["sampling"].guided)) is not None:
        print("csdgen serve: warm-up: nothing to compile (this model runs on the eager engine)", flush=True)
        return
    report = warmup(model, [capacity], [window], guided=kwargs["sampling"].guided, conditions=[request.condition],
                    capacity=capacity, compile=engine_kwargs.get("compile"))  # --compile / --no-compile, else the device's default
    if not report.shapes:
        print(f"csdgen serve: warm-up: nothing to compile (the static engine runs uncompiled on {model.device.type})",
              flush=True)
        return
    print(f"csdgen serve: warm-up: {report.made} step shapes compiled ({report.held} already held) in "
          f"{report.seconds:.1f} s", flush=True)


def served_model(args):
    """``(ServedModel, capacity, default request)`` of parsed ``csdgen serve`` options: the model
    loaded, the batch capacity (``--max-batch`` capped by memory) and the request defaults checked
    as a request would be. Prints the run line (model, device, dtype). One server runs it in
    :func:`run`; every Ray Serve replica runs it in its own process (:mod:`csdgen.serve.deployment`).

    Raises:
        ValueError: one line naming the option and what is allowed.
    """
    from csdgen.torch_threads import call_in_thread

    # loading and warming up run in a thread that ends with them: the scheduler's thread then holds
    # the process's only OpenMP pool (csdgen.torch_threads)
    return call_in_thread(_served_model, args)


def _served_model(args):
    from csdgen.serve import ServeDefaults, ServedModel
    from csdgen.serve.schemas import APIError, parse_request

    from ._common import add_plan, clamp_window, note, print_run_line, refuse_unfit_default_top_k

    model, name, aliases, plan = _load(args)
    refuse_unfit_default_top_k(args, model)  # as generate and bench: not dropped from every request unsaid
    largest = plan.largest_batch()  # the most images the memory plan fits (None: free memory unknown)
    if args.max_batch is None:  # on cuda the plan's largest batch; on cpu CPU_MAX_BATCH (both capped by memory below)
        args.max_batch = max(1, min(largest, PLAN_MAX_BATCH)) if model.device.type == "cuda" and largest else CPU_MAX_BATCH
    from dataclasses import replace

    add_plan(args, replace(plan, batch_size=args.max_batch))
    print_run_line(args, file=sys.stdout)  # the first line: model, device, dtype and why, the memory plan
    limit = args.max_batch if largest is None else largest  # free memory unknown: --max-batch alone
    if limit < 1:
        raise ValueError(f"not even one image fits in the memory allowed ({args.max_memory} GiB with --max-memory, "
                         f"or what {model.device.type} has free); raise --max-memory or use another device")
    capacity = min(args.max_batch, limit)
    if capacity < args.max_batch:
        note(f"--max-batch {args.max_batch}: about {limit} images fit in the memory allowed; admitting at most {capacity}")
    # --window above the image length: its tokens, with a note (as generate and bench); a request's own
    # window above N stays a 400
    window = clamp_window(args.window or "auto", model.num_image_tokens)
    defaults = ServeDefaults(method=args.method, window=window, guidance_scale=args.guidance_scale,
                             temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, lam=args.lam,
                             delta=args.delta, entropy_unit=args.entropy_unit, addition_c=args.addition_c,
                             gsd_radius=args.gsd_radius, lantern_delta=args.lantern_delta, draft_init=args.draft_init,
                             refresh=args.refresh, partial_every=args.partial_every,
                             max_images=args.max_images, guidance_schedule=args.guidance_schedule)
    served = ServedModel(model, args.served_name or name, aliases=aliases, defaults=defaults,
                         engine=getattr(args, "engine", "auto"), compile=getattr(args, "compile", None))
    try:  # the defaults are checked as a request would be: a bad --top-p fails here, not on every request
        default_request = parse_request({"prompt": "0" if served.classes else "a test"}, served)
    except APIError as exc:
        # the request field a default fills (the prompt is the check's own: a model that refuses every prompt says why)
        option = "" if exc.param == "prompt" else f" (the --{exc.param.replace('_', '-')} option)"
        raise ValueError(f"request defaults: {exc.message}{option}") from None
    if args.warmup:
        _warmup(model, default_request, capacity, served.engine_kwargs)
    return served, capacity, default_request


def run(args) -> int:
    from csdgen.serve import create_app, run_server
    from csdgen.serve.app import bind_socket

    if args.replicas is not None:
        return _run_replicas(args)
    if args.max_replicas is not None:
        raise ValueError(f"--max-replicas {args.max_replicas} needs --replicas N (the fewest replicas; Ray Serve "
                         f"autoscales between the two)")
    if args.replica_cpus is not None:
        raise ValueError(f"--replica-cpus {args.replica_cpus} needs --replicas N (one server here uses this "
                         f"process's torch threads: set OMP_NUM_THREADS)")
    sock = bind_socket(args.host, args.port)  # a taken port fails before the model loads
    served, capacity, _ = served_model(args)
    app = create_app(served, capacity=capacity, max_queue=args.max_queue, batching=args.batching)
    port = sock.getsockname()[1]
    host = f"[{args.host}]" if ":" in args.host else args.host

    def ready() -> None:
        print(f"csdgen serve: serving {served.name} on http://{host}:{port}/v1 (POST /v1/images/generations; max batch "
              f"{capacity}, {args.batching} batching; Ctrl-C stops it)", flush=True)

    import signal

    try:
        stopped_by = run_server(app, sock, on_ready=ready, log_level=args.log_level)
    except KeyboardInterrupt:
        stopped_by = signal.SIGINT
    if stopped_by == signal.SIGINT:  # 130 also where SIGINT came ignored: uvicorn's re-raise then does nothing
        print("csdgen serve: stopped", file=sys.stderr, flush=True)
        return 130
    return 0


def _run_replicas(args) -> int:
    """``csdgen serve --replicas N``: a local Ray and Serve with N replicas on --host/--port."""
    from csdgen.serve.app import bind_socket
    from csdgen.serve.deployment import application, run_local

    # every replica's lines as they come (read by Ray when it is imported, below): Ray's deduplication held
    # one replica's lines that looked like another's (start-up, access lines) and folded them into "[repeated Nx]"
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    args.max_batch = args.max_batch or CPU_MAX_BATCH  # each replica's target and admission limit
    if args.max_replicas is not None and args.max_replicas < args.replicas:
        raise ValueError(f"--max-replicas {args.max_replicas}: allowed at least --replicas ({args.replicas})")
    args.replica_cpus = args.replica_cpus or 1
    if "RAY_ADDRESS" not in os.environ and args.replica_cpus > (os.cpu_count() or 1):  # its torch threads too
        raise ValueError(f"--replica-cpus {args.replica_cpus}: this machine has {os.cpu_count()} CPUs; allowed "
                         f"1..{os.cpu_count()} on a local Ray (each replica runs that many torch threads)")
    from csdgen.interrupts import restore_ctrl_c

    restore_ctrl_c()  # started as `csdgen serve --replicas N &`: SIGINT stops it from here on, start-up included
    sock = bind_socket(args.host, args.port)  # a taken port fails before Ray starts; 0: a free one for Ray's proxy
    port = sock.getsockname()[1]
    sock.close()
    app = application(served_model, args, replicas=args.replicas, max_replicas=args.max_replicas,
                      num_cpus=args.replica_cpus)
    if "RAY_ADDRESS" not in os.environ:  # a local Ray: its replicas run here, and fail as this process would
        _check_before_ray(args)
    count = (f"{args.replicas} replica{'s' if args.replicas > 1 else ''}" if args.max_replicas is None
             else f"{args.replicas}..{args.max_replicas} replicas")

    def ready(address: tuple[str, int]) -> None:  # the proxy's own address: a cluster's Serve may listen elsewhere
        host = f"[{address[0]}]" if ":" in address[0] else address[0]
        print(f"csdgen serve: serving {args.served_name or ('csdgen-builtin' if args.model is None else args.model)} "
              f"on http://{host}:{address[1]}/v1 (POST /v1/images/generations; {count} on Ray Serve, max batch "
              f"{args.max_batch} each, {args.batching} batching; Ctrl-C stops it)", flush=True)

    status = run_local(app, args.host, port, cpus=args.replica_cpus * (args.max_replicas or args.replicas),
                       on_ready=ready, log_level=args.log_level)
    if status in (130, 143):  # the replicas, Serve and the Ray it started are down, as one server says it
        print("csdgen serve: stopped", file=sys.stderr, flush=True)
    return status


def _check_before_ray(args) -> None:
    """What every replica of a local Ray would refuse at start, refused here in one line before Ray
    starts (a replica's failure is Ray's traceback, retried per replica): the built-in model (small)
    loaded once on the CPU and its request defaults checked; a checkpoint found, its family, dtype
    and --quantize checked without reading its weights; --device cuda where no CUDA device is visible, or
    more replicas than GPUs (each takes one: Ray would wait for the missing ones without end).

    Raises:
        ValueError, OSError: one line naming the option, as one server's start gives.
    """
    import contextlib
    import copy
    import io

    import torch

    refuse_missing_cuda(args.device)
    if args.device == "cuda" and args.replicas > torch.cuda.device_count():  # Ray would wait for GPUs forever
        count = torch.cuda.device_count()
        raise ValueError(f"--replicas {args.replicas}: each replica takes one GPU of its own and this machine has "
                         f"{count}; allowed --replicas 1..{count} here (--max-replicas may ask for more), or "
                         f"--device cpu")
    probe = copy.copy(args)
    probe.warmup = False
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        if args.model is None:
            probe.device = "cpu"  # no CUDA context in this process: the GPUs are the replicas'
            served_model(probe)
        else:
            _checkpoint_checks(probe)
