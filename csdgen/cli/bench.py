"""``csdgen bench``: the papers' table on any model: latency, acceleration, step compression,
CLIP, FID and NLL of AR, SJD, CSD and the other methods over a prompt set.

Writes into ``--out`` (default ``./bench``): ``bench.json`` (the settings, checked on resume),
``images/<method>-seed<S>/<prompt id>.png`` + ``.safetensors`` (tokens, decisions, entropies),
``records/rank<R>.jsonl`` (one JSON line per image, schema ``csdgen.bench.v1``), then, from
the first process, ``records.jsonl`` (merged), ``report.md``, ``report.csv``,
``acceptance_lengths.csv``, ``texture.csv`` and ``speed_quality_<score>.png``
(:mod:`csdgen.bench`). The same command again resumes; ``torchrun --nproc-per-node N -m
csdgen bench ...`` shards the prompts over N processes.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from . import _options as opt
from ._common import (check_draft_init, choose_dtype, clamp_window, fill_defaults, model_defaults, note, print_run_line,
                      refuse_missing_cuda, sampling_of, vqgan_setting, writable)
from ._options import COMPARE_METHODS

#: the built-in model's default number of prompts (its classes spread over the categories)
BUILTIN_LIMIT = 64


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", allow_abbrev=False, help="the papers' table (latency, CLIP, FID, NLL) over a prompt set; torchrun shards it",
                       description="Run AR, SJD, CSD (or --methods) on every prompt of a prompt set, one image per "
                                   "prompt, method and seed at batch size 1, and write the papers' table (latency, "
                                   "acceleration, step compression, CLIP, FID, NLL) with AR at a second seed as the "
                                   "noise floor. Rerun to resume; `torchrun --nproc-per-node N -m csdgen bench ...` "
                                   "shards the prompts over N processes.")
    p.add_argument("--model", type=opt.path_text, default="builtin",
                   help="'builtin' (default), or a Janus, Emu3, Chameleon-format, GLM-Image or Liquid checkpoint folder or "
                        "Hugging Face repo id in the local cache (no download)")
    p.add_argument("--weights", type=opt.path, default=None, help="built-in model weights folder (default: shipped with csdgen)")
    p.add_argument("--prompts", type=opt.path_text, default=None,
                   help="coco (MS-COCO 2017 val, first caption per image), parti (PartiPrompts) or a file (.txt one per "
                        "line, .jsonl, .tsv); default coco, and for the built-in model its classes spread over the "
                        "categories (a file of class names, one per line, also works)")
    p.add_argument("--limit", type=opt.count(), default=None, metavar="N",
                   help=f"number of prompts (default: all; built-in {BUILTIN_LIMIT})")
    p.add_argument("--offset", type=opt.count(0, maximum=opt.MAX_OFFSET), default=0, metavar="K",
                   help="index of the first prompt (default 0)")
    p.add_argument("--methods", type=opt.names_of(COMPARE_METHODS, "method"), default=["ar", "sjd", "csd"], metavar="LIST",
                   help=f"comma-separated, of {','.join(COMPARE_METHODS)} (default ar,sjd,csd; ar is always run)")
    p.add_argument("--seeds", type=opt.seeds, default=[0], metavar="LIST",
                   help=f"run seeds, comma-separated, distinct, each 0..{opt.MAX_SEED}; every method runs at each (default 0)")
    p.add_argument("--floor-seed", type=_floor_seed, default="auto", metavar="S",
                   help="AR also runs at this seed: the noise floor (default: the first seed + 1, or the next one not in "
                        "--seeds; none = no floor)")
    opt.add_method_options(p, family_note=True, fixed_window=True, auto=False)
    opt.add_preset(p)
    opt.add_sampling(p, family_note=True)
    q = p.add_argument_group("quality scores (NLL is always computed)")
    q.add_argument("--clip-model", type=opt.path_text, default=None, metavar="DIR|ID",
                   help="CLIP score with this CLIP (a local folder or a Hugging Face id in the local cache, e.g. "
                        "openai/clip-vit-large-patch14); default: no CLIP score")
    q.add_argument("--inception-weights", type=opt.path, default=None, metavar="FILE",
                   help="FID Inception-v3 weights file (weights-inception-2015-12-05-6726825d.pth of torch-fidelity); "
                        "with --fid-reference")
    q.add_argument("--fid-reference", type=opt.path, default=None, metavar="DIR",
                   help="folder of real images for FID (e.g. COCO val2017); with --inception-weights")
    g = p.add_argument_group("checkpoints (--model PATH)")
    opt.add_checkpoint_options(g)
    opt.add_quantize(g)
    p.add_argument("--device", choices=opt.DEVICES, default=None,
                   help="default cpu for the built-in model, else cuda when available (under torchrun: cuda:LOCAL_RANK)")
    p.add_argument("--out", type=opt.folder, default=Path("bench"), help="output folder (default ./bench)")
    p.set_defaults(run=run)
    return p


def _floor_seed(text: str):
    if text.strip().lower() in ("none", "auto"):
        return text.strip().lower()
    try:
        return opt.seed(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or none / auto") from None


def _load(load_prompts, source, args):
    """``load_prompts`` with its limit/offset messages naming the options (``--offset 9999: allowed ...``)."""
    try:
        return load_prompts(source, args.limit, args.offset)
    except ValueError as exc:
        if str(exc).startswith(("offset ", "limit ")):
            raise ValueError(f"--{exc}") from None
        raise


def _limit_note(args, source, prompts: list) -> None:
    """One note when ``--limit`` asks for more prompts than ``source`` holds (after the prompts are checked:
    an error about them comes alone)."""
    if args.limit is not None and len(prompts) < args.limit:
        after = f" after --offset {args.offset}" if args.offset else ""
        note(f"--limit {args.limit}: {source} holds {len(prompts)} prompt(s){after}; running those")


def _builtin_prompts(args, classes):
    """Prompts of the built-in model: its classes in the order of
    :meth:`csdgen.class_names.ClassNames.spread` (from ``--offset``: any stretch reaches every
    category), or a file of class names (one per line, as
    :meth:`csdgen.class_names.ClassNames.index` reads them: any case and spacing, short names,
    indices; each written as the model spells it)."""
    from csdgen.prompts import PROMPT_SETS, Prompt, load_prompts
    from csdgen.runs import slug

    if args.prompts is None:
        total = len(classes.names)
        count = args.limit or min(BUILTIN_LIMIT, total - args.offset)
        if args.offset + count > total or count < 1:  # past the last class the spread order starts again: repeats
            limit = f" with --limit {args.limit}" if args.limit else ""
            raise ValueError(f"--offset {args.offset}{limit}: allowed offset + limit <= {total} (the built-in "
                             f"model's {total} classes, each once); give a smaller --offset or --limit")
        indices = list(range(args.offset, args.offset + count))
        names = [classes.names[c] for c in classes.spread(count, offset=args.offset)]
        return [Prompt(f"{i:05d}-{slug(n)}", n) for i, n in zip(indices, names)], indices
    if args.prompts in PROMPT_SETS:
        raise ValueError(f"--prompts {args.prompts}: the built-in model takes class names, not captions; leave --prompts out "
                         f"(its classes spread over the categories) or give a file of class names, one per line "
                         f"(csdgen generate --list-classes lists them)")
    prompts = _load(load_prompts, args.prompts, args)
    canonical = []
    for p in prompts:
        try:
            canonical.append(classes.names[classes.index(p.text)])
        except ValueError as exc:
            raise ValueError(f"--prompts {args.prompts}: {exc}") from None
    return [type(p)(p.id, c, p.category, p.reference) for p, c in zip(prompts, canonical)], \
        list(range(args.offset, args.offset + len(prompts)))


def _builtin_plan(args, device: str):
    from csdgen.bench import BenchPlan

    from ._common import builtin_model

    for option in ("layout", "height", "width", "image_size", "negative_prompt", "positive_prompt", "prompt_template",
                   "vqgan"):  # --dtype: builtin_model takes auto, float32 and bfloat16 and refuses float16
        if getattr(args, option) is not None:
            why = ("takes class names, not text prompts" if option in ("negative_prompt", "positive_prompt", "prompt_template")
                   else "has one size, layout and image decoder")
            raise ValueError(f"--{option.replace('_', '-')} needs --model PATH (a checkpoint); the built-in model {why}")
    args.classes, args.num_images, args.device = None, 1, device
    _fixed_window(args)
    model, _ = builtin_model(args, fixed_window=True)  # loads, moves to the device, fills the defaults, clamps the window
    prompts, indices = _builtin_prompts(args, model.classes)
    _limit_note(args, args.prompts, prompts)
    sampling = sampling_of(args)
    from csdgen.run_settings import model_settings

    # the model as generate records it (weights, digest, dtype, quantize): one rule for both commands
    settings = {**model_settings(model), "device": device.split(":")[0],
                "prompts": _prompts_setting(args, "classes spread over the categories"), **_method_settings(args, sampling)}
    return BenchPlan(model, prompts, indices, [model.class_ids([p.text])[0] for p in prompts], _methods(args, model),
                     args.seeds, _floor(args), args.window, sampling, settings, class_names=list(model.class_names))


def _model_plan(args, device: str):
    from csdgen.bench import BenchPlan
    from csdgen.models.auto import load_model
    from csdgen.prompts import load_prompts

    from ._common import checkpoint_setup, require_decoder

    _fixed_window(args)
    prompts = _load(load_prompts, args.prompts or "coco", args)
    folder, family, sampling = checkpoint_setup(args, fixed_window=True)
    dtype = choose_dtype(args, family, device)
    from ._common import quantize_setup, refuse_static_split, split_note

    quantize_setup(args, device)
    refuse_static_split(args)  # before the weights are read
    from csdgen.bench import check_settings

    known = {"model": str(args.model), "checkpoint": os.path.realpath(folder), "family": family, "dtype": dtype,
             "device": device.split(":")[0], "prompts": _prompts_setting(args, "coco"),
             "negative_prompt": args.negative_prompt, "positive_prompt": args.positive_prompt,
             "prompt_template": args.prompt_template, "lam": args.lam, "delta": args.delta,
             "addition_c": args.addition_c, "entropy_unit": args.entropy_unit, **_quantize_setting(args),
             **vqgan_setting(args)}
    check_settings(args.out, known, write=False, partial=True)  # before the weights are read (minutes for 7B)
    model = load_model(folder, dtype=dtype, device=device, layout=args.layout, height=args.height, width=args.width,
                       image_size=args.image_size, batch_size=1, window=args.window, guided=sampling.guided,
                       negative_prompt=args.negative_prompt, positive_prompt=args.positive_prompt,
                       prompts=[p.text for p in prompts], prompt_template=args.prompt_template, vqgan=args.vqgan,
                       quantize=args.quantize, device_map=args.device_map, need_decoder=True)
    require_decoder(model, str(args.model), folder)
    _limit_note(args, args.prompts or "coco", prompts)
    split_note(args, model)
    fill_defaults(args, model_defaults(model, family))
    args.window = clamp_window(args.window, model.num_image_tokens)
    settings = {"model": str(args.model), "checkpoint": os.path.realpath(folder), "family": family, "dtype": dtype,
                "device": device.split(":")[0], "grid": list(model.grid), "prompts": _prompts_setting(args, "coco"),
                "negative_prompt": args.negative_prompt, "positive_prompt": args.positive_prompt,
                "prompt_template": args.prompt_template,
                **_method_settings(args, sampling), **_quantize_setting(args), **vqgan_setting(args)}
    return BenchPlan(model, prompts, list(range(args.offset, args.offset + len(prompts))), [p.text for p in prompts],
                     _methods(args, model), args.seeds, _floor(args), args.window, sampling, settings)


def _quantize_setting(args) -> dict:
    """``{"quantize": name}`` when ``--quantize`` is given (another target; records without it stay as they were)."""
    return {"quantize": args.quantize} if getattr(args, "quantize", None) else {}


def _prompts_setting(args, default: str) -> str:
    """What ``bench.json`` records as the prompt set: a named set as named, a file by its content
    (``"file sha256:<hex>"``), so that ``good.txt``, ``./good.txt``, its absolute path or a copy of
    it resume the same bench. A folder whose bench.json (written before) names the file by a path
    keeps that value when the path still holds the same bytes."""
    import hashlib

    from csdgen.bench import MANIFEST
    from csdgen.jsonio import read_json

    def content(path: Path) -> str:
        return f"file sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"

    given = args.prompts or default
    if not Path(given).is_file():
        return given
    digest = content(Path(given))
    try:  # check_settings reports a malformed or foreign bench.json; here only an older path is looked for
        old = read_json(Path(args.out) / MANIFEST)["settings"]["prompts"]
        if old != digest and Path(old).is_file() and content(Path(old)) == digest:
            return old
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return digest


def _fixed_window(args) -> None:
    if args.window == "auto":
        raise ValueError("--window auto: a bench needs a fixed window, since with auto the images would depend on "
                         "timing (resuming and sharding could change them); give --window W or leave it out (the model's)")


def sampling_text(sampling) -> str:
    """The report's one-line sampling: ``guidance scale 3, temperature 1, top-k none, top-p none``
    (then any other field set away from its default), not the dataclass's dict."""
    from csdgen.sampling import SamplingConfig

    def shown(value) -> str:
        return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    parts = [f"guidance scale {shown(sampling.guidance_scale)}", f"temperature {shown(sampling.temperature)}",
             f"top-k {shown(sampling.top_k)}", f"top-p {shown(sampling.top_p)}"]
    default = SamplingConfig()
    for name in ("guidance_schedule", "top_n_sigma", "top_n_sigma_centered"):
        if getattr(sampling, name) != getattr(default, name):
            parts.append(f"{name.replace('_', ' ')} {shown(getattr(sampling, name))}")
    return ", ".join(parts)


def _method_settings(args, sampling) -> dict:
    from csdgen.run_settings import sampling_record

    settings = {"window": args.window, "sampling": sampling_record(sampling), "lam": args.lam, "delta": args.delta,
                "addition_c": args.addition_c, "entropy_unit": args.entropy_unit, "draft_init": args.draft_init}
    if getattr(args, "preset", None) is not None:  # absent without one: earlier benches still resume
        settings["preset"] = args.preset
    # the engine and compilation change no token but every latency: a resumed row must not mix them
    # (absent at the defaults, so earlier benches still resume)
    settings.update(opt.engine_kwargs(args))
    return settings


def _methods(args, model) -> dict:
    from csdgen.evaluation.compare import method_presets
    from csdgen.models.base import optional_codebook

    presets = method_presets(args.lam, args.delta, args.addition_c, optional_codebook(model),
                             entropy_unit=args.entropy_unit, draft_init=args.draft_init)
    if args.methods is None:  # every method this model has (compare's default)
        check_draft_init(args, list(presets), chosen=False)
        return {n: {**preset, **opt.engine_kwargs(args)} for n, preset in presets.items()}
    names = args.methods if "ar" in args.methods else ["ar", *args.methods]
    check_draft_init(args, names, chosen=True)
    missing = [n for n in names if n not in presets]
    if missing:
        model.codebook_embeddings()  # a model that has a codebook but cannot give it says why (CodebookUnavailable)
        raise ValueError(f"--methods {missing[0]}: this model has no codebook embeddings (GSD and LANTERN need them); "
                         f"allowed here: {', '.join(presets)}")
    return {n: {**presets[n], **opt.engine_kwargs(args)} for n in names}


def _floor(args):
    """The noise floor's seed: ``--floor-seed``, or by default the first seed above the first run
    seed that is not a run seed (``--seeds 0,1`` -> 2); None for ``--floor-seed none``.

    Raises:
        ValueError: no seeds; a given floor seed that is a run seed; no free seed above the first."""
    if not args.seeds:
        raise ValueError("--seeds is empty: give at least one seed, e.g. --seeds 0")
    if args.floor_seed == "none":
        return None
    if args.floor_seed == "auto":
        taken = set(args.seeds)
        floor = args.seeds[0] + 1
        while floor in taken and floor <= opt.MAX_SEED:
            floor += 1
        if floor > opt.MAX_SEED:
            raise ValueError(f"--seeds {','.join(map(str, args.seeds))}: the noise floor runs AR at the first seed above "
                             f"the first run seed that is not a run seed, and none is left in 0..{opt.MAX_SEED}; give "
                             f"--floor-seed S or none")
        return floor
    floor = args.floor_seed
    if floor in args.seeds:  # AR at a run seed is the run's own AR: the floor would compare AR with itself
        raise ValueError(f"--floor-seed {floor} is also a run seed (--seeds {','.join(map(str, args.seeds))}); the noise "
                         f"floor needs another seed: give --floor-seed S not in --seeds, or none")
    return floor


def _check_score_files(args) -> None:
    """The quality scores' options, checked before the model loads (minutes for a 7B checkpoint): FID's two
    options together, a --clip-model path that is a folder, the Inception weights file, reference images."""
    if (args.inception_weights is None) != (args.fid_reference is None):
        given, other = (("--inception-weights", "--fid-reference DIR (a folder of real images, e.g. COCO val2017)")
                        if args.fid_reference is None else
                        ("--fid-reference", "--inception-weights FILE (torch-fidelity's weights-inception-2015-12-05-6726825d.pth)"))
        raise ValueError(f"{given} needs {other} for FID")
    if args.clip_model is not None:
        from csdgen.evaluation.clip_score import check_clip_path

        check_clip_path(args.clip_model)
    if args.inception_weights is not None:
        from csdgen.evaluation.fid import check_inception_path, image_files

        check_inception_path(args.inception_weights)
        image_files(args.fid_reference, at_least=2)  # before any image is generated


def _scorers(args, plan, device: str, out: Path):
    """The quality scorers, loaded before any image is generated (missing weights fail at once)."""
    from csdgen.bench import Scorers

    _check_score_files(args)
    scorers = Scorers()
    if args.clip_model is not None:
        from csdgen.evaluation.clip_score import ClipScorer

        scorers.clip = ClipScorer(args.clip_model, device=device)
        scorers.notes.append(f"CLIP score: 100 * max(cos, 0) with {args.clip_model}")
    if args.inception_weights is not None:
        from csdgen.evaluation.fid import FidScorer, image_files

        scorers.fid = FidScorer(args.inception_weights, args.fid_reference, device=device,
                                cache=out / "scores" / "fid_reference.safetensors")
        # the images FID reads, not every entry of the folder (COCO folders hold annotation files, subfolders)
        scorers.notes.append(f"FID: Inception-v3 pool features against {len(image_files(args.fid_reference))} reference "
                             f"images in {args.fid_reference}")
    if plan.class_names is not None:
        from csdgen.evaluation.quality import QualityScorer

        scorers.builtin = QualityScorer(plan.model)
    elif scorers.clip is None and scorers.fid is None:
        note("no CLIP score and no FID (NLL only): pass --clip-model DIR (download openai/clip-vit-large-patch14) and "
             "--inception-weights FILE --fid-reference DIR to add them")
    return scorers


def run(args) -> int:
    done = execute(args)
    if done is not None:
        _, out, written = done
        print(written["report.md"].read_text().split("## Settings")[0].rstrip())
        print(f"Wrote {out}/report.md, report.csv, records.jsonl and {len(written) - 2} more files")
    return 0


def _check_methods(plan) -> None:
    """Every method of the plan resolved against its model as :func:`csdgen.generate` will
    (:func:`csdgen.engine.generation.resolve_arguments`), before the output folder is made: a
    refused bench leaves no ``bench.json`` behind.

    Raises:
        ValueError: as :func:`csdgen.generate` (e.g. ``top_k`` above the codebook size).
    """
    from csdgen.engine import resolve_arguments

    for kwargs in plan.methods.values():
        resolve_arguments(plan.model, kwargs.get("method", "csd"), kwargs.get("window", plan.window), plan.sampling,
                          kwargs.get("draft_init"), kwargs.get("refresh"), plan.seeds[0] if plan.seeds else 0,
                          kwargs.get("preset"))


def execute(args, adjust=None, title: str = "csdgen bench"):
    """Plan, generate (resuming) and report a bench from parsed ``csdgen bench`` options: the one
    runner behind ``bench``, and ``compare`` and ``sweep`` with ``--model``/``--prompts``.

    Args:
        args: the namespace of ``csdgen bench``'s parser.
        adjust: called with the :class:`csdgen.bench.BenchPlan` before anything is generated (e.g.
            ``sweep`` replaces its methods by the sweep's settings); returns the plan to run.
        title: the report's title.

    Returns:
        ``(plan, out folder, {name: path} of the report files)`` in the first process, None in the others.

    Raises:
        ValueError: bad options (one line each), other settings in the output folder.
    """
    import torch
    from tqdm import tqdm

    from csdgen import bench
    from csdgen.folder_kinds import refuse_other_kind
    from csdgen.folder_lock import refuse_busy

    _floor(args)  # bad seeds fail before the model loads
    _check_score_files(args)  # and missing CLIP / FID files
    device_type = args.device or ("cuda" if args.model != "builtin" and torch.cuda.is_available() else "cpu")
    refuse_missing_cuda(device_type)
    rank, world, local = bench.distributed(device_type)
    # a folder another run writes now is refused before the model loads (run_shard takes the lock)
    refuse_busy(args.out, file=f"{bench.RECORDS_DIR}/rank{rank}.jsonl", what=f"bench (its process of rank {rank})")
    refuse_other_kind(args.out, "bench")  # and another kind of output (before the weights are read)
    try:
        device = f"cuda:{local}" if device_type == "cuda" else "cpu"
        plan = _builtin_plan(args, device) if args.model == "builtin" else _model_plan(args, device)
        if adjust is not None:
            plan = adjust(plan)
        _check_methods(plan)  # a value the model refuses (--top-k above V) is refused before --out is made
        out = writable(args.out)
        scorers = _scorers(args, plan, device, out) if rank == 0 else None
        with tqdm(total=0, unit="img", desc=f"bench rank {rank}/{world}" if world > 1 else "bench",
                  disable=None if rank == 0 else True, leave=False) as bar:
            def start(todo: int) -> None:
                if todo and rank == 0:
                    print_run_line(args)  # the run's first line: model, device, dtype and why
                bar.total = todo
                bar.refresh()

            def record(r: dict) -> None:
                bar.set_postfix_str(f"{r['method']} seed {r['seed']}")
                bar.update(1)

            bench.run_shard(plan, out, rank=rank, world=world, on_start=start, on_record=record)
        bench.barrier()  # every process has written its records
        bench.leave()
        if rank != 0:
            return None
        notes = [f"this command: {bench.machine()}, {world} process{'es' if world > 1 else ''}; batch size 1; "
                 f"window {plan.window}; {sampling_text(plan.sampling)}",
                 f"model: {plan.settings['model']}; prompts: {args.prompts or plan.settings['prompts']}, {len(plan.prompts)} from index "
                 f"{plan.indices[0]}; methods: {', '.join(plan.methods)}; seeds: {', '.join(map(str, plan.seeds))}"
                 + ("" if plan.floor_seed is None else f"; noise floor: ar at seed {plan.floor_seed}")]
        return plan, out, bench.finish(plan, out, scorers, notes=notes, title=title)
    finally:
        bench.leave()


def add_bench_source(p: argparse.ArgumentParser, command: str) -> None:
    """``--model``, ``--prompts``, ``--limit``, ``--offset`` of ``compare`` and ``sweep``: given, the command runs
    through ``csdgen bench``'s runner (batch size 1, records, resume; ``--class`` and ``-n`` refused, ``--batch-size`` not used)."""
    g = p.add_argument_group(f"any model or prompt set (then {command} runs as csdgen bench: batch size 1, one "
                             f"record per image, resumable; --class and -n are refused: use --limit and --offset; "
                             f"--batch-size is not used)")
    g.add_argument("--model", type=opt.path_text, default="builtin",
                   help="'builtin' (default), or a Janus, Emu3, Chameleon-format, GLM-Image or Liquid checkpoint folder "
                        "or Hugging Face repo id in the local cache (no download)")
    g.add_argument("--prompts", type=opt.path_text, default=None,
                   help="coco, parti or a prompt file (.txt, .jsonl, .tsv), as csdgen bench (default coco; the "
                        "built-in model takes a file of class names)")
    g.add_argument("--limit", type=opt.count(), default=None, metavar="N",
                   help=f"number of prompts (default: all; built-in {BUILTIN_LIMIT})")
    g.add_argument("--offset", type=opt.count(0, maximum=opt.MAX_OFFSET), default=0, metavar="K",
                   help="index of the first prompt (default 0)")
    opt.add_checkpoint_options(g)  # bench's: a checkpoint's layout, size, files, Emu3's prompts, template, dtype


def uses_bench(args) -> bool:
    """True when ``compare``/``sweep`` options ask for a checkpoint or a prompt set (see :func:`add_bench_source`)."""
    return args.model != "builtin" or args.prompts is not None


def refuse_bench_only(args) -> None:
    """``--limit``/``--offset`` of ``compare``/``sweep`` without ``--prompts``/``--model``: refused (they choose
    prompts of a prompt set; the built-in run takes -n and --class).

    Raises:
        ValueError: naming the option and that it needs --prompts.
    """
    for option, given in (("--limit", args.limit is not None), ("--offset", args.offset != 0)):
        if given:
            value = args.limit if option == "--limit" else args.offset
            raise ValueError(f"{option} {value} needs --prompts FILE (or --model PATH): it chooses prompts of a prompt "
                             f"set; without them give -n N (and --class) for the built-in images")


def bench_namespace(args, skip=(), **overrides) -> argparse.Namespace:
    """``csdgen bench``'s options for another command: bench's defaults, then every option of ``args``
    that bench also has (except the names in ``skip``, which mean something else there), then ``overrides``.

    Raises:
        ValueError: ``--class`` or ``-n`` given (built-in options; with --model/--prompts use --limit).
    """
    if getattr(args, "classes", None) is not None or getattr(args, "num_images", None) is not None:
        raise ValueError("--class and -n/--num-images choose built-in images; with --model or --prompts give "
                         "--limit N (and --offset K) instead")
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    out = parser.parse_args(["bench"])
    for name, value in vars(args).items():
        if name != "run" and name not in skip and hasattr(out, name):
            setattr(out, name, value)
    for name, value in overrides.items():
        setattr(out, name, value)
    out.command = getattr(args, "command", None) or "bench"  # the run's first line names the command typed
    return out


def builtin_run_or_bench(args, run_bench) -> int | None:
    """How ``compare`` and ``sweep`` start: ``--list-classes`` answered, a ``--model`` / ``--prompts``
    run handed to ``run_bench`` (run as ``csdgen bench``); both return the exit status. None: a
    built-in run goes on (options of the bench path refused, ``-n`` 64 when not given)."""
    from ._common import list_classes

    if args.list_classes is not None:
        return list_classes(args)
    if uses_bench(args):
        return run_bench(args)
    refuse_bench_only(args)
    if args.num_images is None:
        args.num_images = 64
    return None
