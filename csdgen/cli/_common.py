"""What the commands do before running: output folder, the built-in model, defaults, notes.

Heavy modules (torch, the models) are imported inside the functions: only a command that runs
pays for them.
"""

from __future__ import annotations

import contextlib

import os
import re
import sys
import tempfile
from pathlib import Path

from ..class_names import folder_error, shown_path

SAMPLING_KEYS = ("guidance_scale", "temperature", "top_k", "top_p", "lam", "delta")


#: the running command (set by :func:`csdgen.cli.main`): its notes and warnings start ``csdgen COMMAND:``, as
#: its errors and argparse's do
running: dict = {"command": None, "defaulted": set()}


def prefix() -> str:
    """``"csdgen COMMAND"`` for the running command, ``"csdgen"`` outside one (a test calling a helper)."""
    command = running["command"]
    return f"csdgen {command}" if command else "csdgen"


def note(message: str) -> None:
    """A one-line note on stderr (``csdgen COMMAND: note: ...``)."""
    print(f"{prefix()}: note: {message}", file=sys.stderr, flush=True)


#: printed once before the first compiled forward of a run with ``--compile`` (a CPU compile looks like a hang)
COMPILE_NOTE = "compiling the static engine's forwards (first call per shape; on CPU tens of seconds each)"


def compile_note(args, device) -> None:
    """:data:`COMPILE_NOTE` on stderr when the run compiles: ``--compile``, or on CUDA by default (static engine)."""
    import torch

    if getattr(args, "engine", "auto") == "eager":
        return
    compile_ = getattr(args, "compile", None)
    if compile_ if compile_ is not None else torch.device(device).type == "cuda":
        note(COMPILE_NOTE)


def choose_dtype(args, family: str, device) -> str:
    """The model's dtype name for ``--dtype`` (None / ``auto``: the family's default on ``device``,
    :func:`csdgen.models.dtypes.resolve_dtype`), with the run's first line kept in ``args.run_line``
    (:func:`print_run_line` prints it when decoding starts).

    Raises:
        ValueError: ``--dtype`` other than auto / float32 / bfloat16 for the built-in model, or bfloat16 with
            ``--quantize`` (it is quantised from float32).
    """
    import torch

    from csdgen.models.dtypes import resolve_dtype

    given = getattr(args, "dtype", None)
    if family == "builtin":
        from csdgen.models.builtin import BUILTIN_DTYPES

        if given not in (None, "auto", *BUILTIN_DTYPES):
            raise ValueError(f"--dtype {given}: the built-in model runs in {' or '.join(BUILTIN_DTYPES)}; allowed for "
                             f"it: {', '.join(('auto',) + BUILTIN_DTYPES)} (float16 needs --model PATH, a checkpoint)")
        if given == "bfloat16" and getattr(args, "quantize", None):
            raise ValueError(f"--dtype bfloat16 with --quantize {args.quantize}: the built-in model is quantised from "
                             f"float32; allowed: one of the two")
    dtype, reason = resolve_dtype(given, device, family)
    name = str(dtype).removeprefix("torch.")
    what = "the built-in model" if family == "builtin" else f"{family} ({getattr(args, 'model', '')})"
    args.run_line = (f"csdgen {getattr(args, 'command', None) or 'run'}: {what} on {torch.device(device).type}, "
                     f"{name} ({reason})")
    if getattr(args, "quantize", None):
        args.run_line += f", decoder layers {args.quantize}"
    placed = getattr(args, "device_map", None)
    if placed is not None:  # a JSON map of one place puts the whole model there: placed, not split
        one = isinstance(placed, dict) and len({str(v) for v in placed.values()}) == 1
        args.run_line += f", placed on {next(iter(placed.values()))!s} by --device-map" if one else ", split by --device-map"
    return name


def add_plan(args, plan) -> None:
    """Append the memory plan's summary (:meth:`csdgen.models.memory.MemoryPlan.summary`) to the run's first line."""
    if getattr(args, "run_line", None):
        args.run_line += f"; {plan.summary()}"


def split_note(args, model) -> None:
    """With ``--device-map`` splitting the model and ``--engine auto``: one note that it runs on the eager engine."""
    if getattr(model, "device_map", None) and len({str(v) for v in model.device_map.values()}) > 1 \
            and getattr(args, "engine", "auto") == "auto":
        note("--device-map: the model is split across devices; the static engine cannot follow its layers, "
             "so it runs on the eager engine (each layer's KV cache stays with its layer)")


def refuse_static_split(args) -> None:
    """``--engine static`` (or ``--compile``, which compiles the static engine's steps) with a ``--device-map``
    JSON object that surely splits the model: refused before any weight is read, with the reason the static
    engine gives once the model is loaded (a user of a 7B checkpoint waited for its weights to hear it).

    A map surely splits the model where it names more than one place, or offloads a module to ``"disk"``
    (the decoder cannot live there whole; the modules it leaves out go to ``--device``). A named map
    (``auto``, ``balanced``, ``sequential``), or a JSON object of one device other than ``--device`` that
    may or may not cover every module, is placed by accelerate while the weights load: the engine refuses
    a split model then, as before.

    Raises:
        ValueError: naming the option, the places the map names and what is allowed.
    """
    placed = getattr(args, "device_map", None)
    engine, compiled = getattr(args, "engine", "auto"), getattr(args, "compile", None)
    if not isinstance(placed, dict) or not (engine == "static" or compiled):
        return
    places = sorted({str(v) for v in placed.values()})
    if not (len(places) > 1 or (places == ["disk"] and "" not in placed)):
        return
    option = "--engine static" if engine == "static" else "--compile"
    allowed = "--engine eager (or auto) for this map" if engine == "static" else "--no-compile for this map"
    raise ValueError(f"{option} cannot be used with --device-map placing modules on {', '.join(map(repr, places))}"
                     f"{' (and the rest on --device)' if places == ['disk'] else ''}: the model is split across "
                     f"devices, and the static engine's one preallocated cache and compiled steps do not follow layers "
                     f"that live, or are loaded, elsewhere; allowed: {allowed}")


def refuse_missing_cuda(device) -> None:
    """``--device cuda`` where no CUDA device is visible: one line, before anything loads.

    Raises:
        ValueError: naming ``--device cuda`` and the device to use instead.
    """
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is visible here; use --device cpu")


def quantize_setup(args, device, *, builtin: bool = False) -> None:
    """Refuse ``--quantize`` the device or installed packages cannot run, before any weight is read (one line);
    with ``builtin``, what the built-in model (quantised in memory) cannot take first."""
    from csdgen.models.quantize import check_in_memory_quantize, check_quantize

    (check_in_memory_quantize if builtin else check_quantize)(getattr(args, "quantize", None), device)


def print_run_line(args, file=None) -> None:
    """The run's first line (:func:`choose_dtype`), once, on stderr (or ``file``): what runs where in which dtype."""
    line = getattr(args, "run_line", None)
    if line:
        print(line, file=file or sys.stderr, flush=True)
        args.run_line = None


def _cannot_be_made(folder: Path, exc: OSError) -> ValueError:  # e.g. "File name too long": not even looked at
    return ValueError(f"output folder {shown_path(folder)!r} cannot be made ({folder_error(folder, exc)}); "
                      f"choose another with --out")


def refuse_file_out(folder: Path) -> None:
    """Refuse, without making anything, an output folder that is a file or lies inside one (a check that can
    run before a model's weights are read; :func:`writable` makes the folder later).

    Raises:
        ValueError: naming the folder and the file, with "choose another with --out".
    """
    try:
        blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        # a link to nothing (or a loop of links): mkdir says "File exists", as for a file
        broken = next((p for p in (folder, *folder.parents) if p.is_symlink() and not p.exists()), None)
    except OSError as exc:
        raise _cannot_be_made(folder, exc) from None
    if broken is not None:
        where = "is" if broken == folder else f"is inside {shown_path(broken)!r}, which is"
        raise ValueError(f"output folder {shown_path(folder)!r} {where} a symbolic link to {os.readlink(broken)!r}, which "
                         f"does not exist (or is a loop of links); choose another with --out, or mend the link")
    if blocker is not None:  # mkdir would say "File exists", which reads as if the folder were there
        where = "is" if blocker == folder else f"is inside {shown_path(blocker)!r}, which is"
        raise ValueError(f"output folder {shown_path(folder)!r} {where} a file, not a folder; choose another with --out")


def writable(folder: Path) -> Path:
    """Create ``folder`` and check that files can be written there.

    Raises:
        ValueError: naming the folder (:func:`shown_path`) and the reason, with "choose another with --out".
    """
    refuse_file_out(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # a probe name of its own: ranks under torchrun check the same folder at once, and a shared name let
        # one rank's unlink race another's
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".csdgen-write-test-")
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        import errno

        if exc.errno == errno.ENAMETOOLONG:
            raise _cannot_be_made(folder, exc) from None
        made = next((p for p in (folder, *folder.parents) if p.is_dir()), None)  # the folder the write was refused in
        inside = f" ({shown_path(made)!r} is not writable)" if made is not None and made != folder else ""
        raise ValueError(f"output folder {shown_path(folder)!r} is not writable{inside} ({exc.strerror}); choose another "
                         f"with --out") from None
    return folder


def needs_model(flags: list[str]) -> str:
    """``"--dtype needs --model"`` / ``"--dtype, --layout need --model"``: the head of the refusal of
    options only a checkpoint takes (generate, serve, demo), the verb agreeing with the count."""
    return f"{', '.join(flags)} {'needs' if len(flags) == 1 else 'need'} --model"


def apply_preset(args) -> None:
    """``--preset NAME``: fill every option the user left out (None) from the preset (``csdgen.models.defaults.PRESETS``);
    then ``--refresh`` left out takes the method's default (``METHOD_REFRESH``).

    A preset's draft initialisation is not given to a method whose rule needs its own (GSD, LANTERN:
    one-hot drafts), as ``generate(preset=...)`` does; ``args.draft_init_given`` records whether
    ``--draft-init`` itself was given (:func:`check_draft_init`)."""
    from ._options import method_draft_init, method_refresh, presets

    if hasattr(args, "draft_init"):
        args.draft_init_given = args.draft_init is not None
    if hasattr(args, "window"):
        args.window_given = args.window is not None
    if getattr(args, "command", None) == "generate":
        note_unused(args)
    name = getattr(args, "preset", None)
    if name is not None:
        for key, value in presets()[name].items():
            if key == "draft_init" and method_draft_init(getattr(args, "method", None) or "") is not None:
                continue
            if hasattr(args, key) and getattr(args, key) is None:
                setattr(args, key, value)
    if hasattr(args, "refresh") and args.refresh is None and hasattr(args, "method"):
        args.refresh = method_refresh(args.method)
    if isinstance(getattr(args, "method", None), str):
        check_draft_init(args, [args.method], chosen=True, option="--method")


def note_unused(args) -> None:
    """A note on stderr per option given that ``--method`` does not use (``--lam`` with sjd, ``--refresh``
    with ar; :mod:`csdgen.method_options`), before defaults and presets fill them: it was dropped
    silently. ``--addition-c`` and ``--entropy-unit`` have defaults of their own: noted when changed."""
    from csdgen.method_options import unused_options

    method = getattr(args, "method", None)
    if not isinstance(method, str):
        return
    given = {key: getattr(args, key, None) for key in ("lam", "delta", "draft_init", "refresh")}
    given["addition_c"] = args.addition_c if getattr(args, "addition_c", 0.2) != 0.2 else None
    given["entropy_unit"] = args.entropy_unit if getattr(args, "entropy_unit", "nats") != "nats" else None
    given["gsd_radius"] = getattr(args, "gsd_radius", None)
    given["lantern_delta"] = getattr(args, "lantern_delta", None)
    for key, value, why in unused_options(given, method):
        shown_value = f"{value:g}" if key in ("addition_c", "lantern_delta") else value
        note(f"--{key.replace('_', '-')} {shown_value} does not apply to --method {method} ({why}); it is not used")


def check_draft_init(args, names: list[str], chosen: bool, option: str = "--methods") -> None:
    """``--draft-init`` given against the methods ``names`` (``generate``'s ``--method``, ``compare`` /
    ``bench``'s ``--methods``): where a method's rule needs other drafts (GSD and LANTERN: one-hot), a
    method the user named (``chosen``) is refused; one run only because it is in the default set of
    methods runs with the drafts its rule needs, and a note says so.

    Raises:
        ValueError: naming the option, the method and the allowed initialisations.
    """
    from ._options import ONE_HOT_INITS, method_draft_init

    given = getattr(args, "draft_init", None)
    if given is None or not getattr(args, "draft_init_given", True):
        return
    clash = {}
    for name in names:
        needed = method_draft_init(name)
        allowed = ONE_HOT_INITS if needed == "onehot" else (needed,)
        if needed is not None and given not in allowed:
            clash[name] = (needed, allowed)
    if not clash:
        return
    if chosen:
        name, (needed, allowed) = next(iter(clash.items()))
        raise ValueError(f"--draft-init {given} conflicts with {option} {name}, whose rule needs {needed} drafts; "
                         f"allowed with it: {', '.join(allowed)} (or leave --draft-init out)")
    note(f"--draft-init {given} is not used by {', '.join(clash)}: their rules need "
         f"{', '.join(sorted({n for n, _ in clash.values()}))} drafts, and run with them")


def model_defaults(model, family: str) -> dict:
    """The defaults the model carries (``model.defaults``), else the family's table entry, as a dict."""
    from dataclasses import asdict

    from csdgen.models.defaults import FAMILY_DEFAULTS

    defaults = getattr(model, "defaults", None) or FAMILY_DEFAULTS[family]
    return asdict(defaults)


def fill_defaults(args, defaults: dict, keys=SAMPLING_KEYS) -> None:
    """Set every option in ``keys`` the user left out from ``defaults``; ``--top-k 0`` -> None."""
    for key in keys:
        if getattr(args, key, None) is None:
            setattr(args, key, defaults[key])
            running["defaulted"].add(key)  # an error about its value names it as the model's default
    if getattr(args, "top_k", None) == 0:
        args.top_k = None


def refuse_unfit_default_top_k(args, model) -> None:
    """With ``--top-k`` not given, refuse a model whose default top-k (``model.defaults``: its family's) exceeds its
    codebook size (a tiny checkpoint under its family's top-k), as ``generate`` and ``bench`` refuse it, naming the
    value as the model's default; :func:`csdgen.engine.default_sampling` would drop it without a word.

    Raises:
        ValueError: ``--top-k 2048 (the model's default; --top-k was not given): exceeds the codebook size ...``.
    """
    from csdgen.engine import check_top_k

    if getattr(args, "top_k", None) is not None:
        return
    try:
        check_top_k(model, getattr(getattr(model, "defaults", None), "top_k", None))
    except ValueError as error:
        running["defaulted"].add("top_k")
        raise ValueError(option_named(str(error))) from None


def vqgan_setting(args) -> dict:
    """``{"vqgan": folder}`` when ``--vqgan`` is given, else ``{}``: what a run's or bench's record keeps of a
    checkpoint's image decoder, as the folder that holds it, resolved (``ck/tokenizer``, its absolute path and
    ``ck/tokenizer/vqgan.ckpt`` are the same decoder: the option takes a decoder's folder or its checkpoint file).
    Another decoder makes other images from the same tokens; absent, the record means the default decoder (found
    with the checkpoint), as records written before the option was recorded do."""
    given = getattr(args, "vqgan", None)
    if given is None:
        return {}
    path = os.path.realpath(given)
    return {"vqgan": os.path.dirname(path) if os.path.isfile(path) else path}


def sampling_of(args):
    """The run's :class:`csdgen.SamplingConfig` (validated; a bad value is named by its option,
    ``--top-p 2.0: ...``, not by the library's argument name).

    Raises:
        ValueError: a value SamplingConfig refuses, naming the option."""
    from csdgen.sampling import SamplingConfig

    try:
        return SamplingConfig(guidance_scale=args.guidance_scale, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p)
    except ValueError as error:
        raise ValueError(option_named(str(error))) from None


def option_named(text: str) -> str:
    """A library message about an argument as the CLI names its option: a sampling argument's
    (``top_k=1025 exceeds ...`` -> ``--top-k 1025: exceeds ...``), ``engine='static'`` -> ``--engine static``,
    ``vqgan_dir='x'`` -> ``--vqgan 'x'``; any other message as it is."""
    text = re.sub(r"\bengine='(\w+)'", r"--engine \1", text)
    text = re.sub(r"\bvqgan_dir=", "--vqgan ", text)
    for name in ("guidance_scale", "temperature", "top_k", "top_p"):
        if text.startswith(name + "="):
            tail = text[len(name) + 1:]
            # "top_p=2.0: must be ..." or "top_k=1025 exceeds the codebook size ...": the value ends at ": " or " "
            value, _, rest = tail.partition(": " if tail.find(": ") == tail.find(" ") - 1 else " ")
            rest = rest.replace("must be None or ", "must be ")  # None is the library's "off"
            option = f"--{name.replace('_', '-')}"
            if name in running["defaulted"]:  # a value the user never typed: say where it came from
                return f"{option} {value} (the model's default; {option} was not given): {rest}"
            return f"{option} {value}: {rest}"
    return text


def clamp_window(window: int | str, num_tokens: int) -> int | str:
    """``window`` capped at the image length, with a note when it was larger (``"auto"`` as is)."""
    if window != "auto" and window > num_tokens:
        note(longer_than_image([window], num_tokens))
        return num_tokens
    return window


def longer_than_image(windows: list[int], num_tokens: int, option: str = "--window", once: bool = False) -> str:
    """The note on windows capped at the image length (:func:`clamp_window`; sweep's ``--windows``, whose
    capped windows run ``once``): ``--window 1000 is longer than the image (256 tokens): using 256``."""
    given = ",".join(map(str, windows))
    return (f"{option} {given} {'is' if len(windows) == 1 else 'are'} longer than the image ({num_tokens} tokens): "
            f"using {num_tokens}{' once' if once else ''}")


def class_items(given: list[str] | None, classes) -> list[str] | None:
    """``--class`` values (each a comma-separated list, repeated or not) -> their items, split by
    :meth:`csdgen.class_names.ClassNames.split` (commas inside a known name are kept); None if none given."""
    if given is None:
        return None
    return [item for text in given for item in classes.split(text)]


def list_classes(args) -> int:
    """``--list-classes [CATEGORY]``: print the built-in classes by category, read from config.json
    (``--weights`` or the shipped one) without loading the model. Returns the exit status 0.

    Raises:
        ValueError: no category matches (naming the categories), a malformed config.
    """
    from . import _options

    classes = _options.class_lookup(args.weights)
    print(classes.listing(args.list_classes or None))
    print(f"{len(classes)} classes in all; give names (any case), indices or random to --class")
    if classes.num_elsewhere:
        print(f"{classes.num_elsewhere:,} other emoji names are known but not drawn: each is answered with the "
              f"classes nearest to it")
    return 0


def default_window(args, defaults: dict, fixed: bool) -> None:
    """``--window`` left out: ``"auto"`` (as :func:`csdgen.generate`), or with ``fixed`` the model's
    measured window (compare: bit-reproducible tables)."""
    if getattr(args, "window", None) is None:
        args.window = defaults["window"] if fixed else "auto"


def refuse_builtin_layout(layout: str | None) -> None:
    """Refuse ``--layout`` for the built-in model (it picks a Chameleon checkpoint's layout).

    Raises:
        ValueError: ``--layout anole needs --model (a Chameleon checkpoint) ...``.
    """
    if layout is not None:
        raise ValueError(f"--layout {layout} needs --model (a Chameleon checkpoint); the built-in model has a layout of its own")


def builtin_model(args, fixed_window: bool = False, spread: bool = False):
    """Load the built-in model on ``--device`` (default cpu), with its defaults filled into ``args``.

    Returns:
        ``(model, classes)``: the model and one class index per image (``-n`` images, default 8,
        taking ``--class`` in turn, ``random`` drawn from ``--seed``, or else the model's
        ``default_classes`` in turn, or every class in turn where it has none;
        with ``spread`` the classes of :meth:`csdgen.class_names.ClassNames.spread`, for measurements).

    Raises:
        ValueError: unknown class (one line with close matches), bad sampling settings, no CUDA.
        FileNotFoundError: no built-in weights.
    """
    from csdgen.models.builtin import load_builtin_model

    refuse_builtin_layout(getattr(args, "layout", None))
    for name in ("image_size", "vqgan"):
        if getattr(args, name, None) is not None:
            raise ValueError(f"--{name.replace('_', '-')} needs --model (a checkpoint); the built-in model has one size "
                             f"and its own VQ decoder")
    for name in ("height", "width", "negative_prompt", "positive_prompt", "prompt_template"):  # compare's, sweep's
        if getattr(args, name, None) is not None:
            why = "draws at one size" if name in ("height", "width") else "takes class names, not text prompts"
            raise ValueError(f"--{name.replace('_', '-')} needs --model (a checkpoint); the built-in model {why}")
    apply_preset(args)
    device = args.device or "cpu"
    refuse_missing_cuda(device)
    dtype = choose_dtype(args, "builtin", device)  # float32 or bfloat16: refuses another --dtype
    refuse_builtin_device_map(args)
    quantize_setup(args, device, builtin=True)
    model = load_builtin_model(args.weights, quantize=getattr(args, "quantize", None), device=device, dtype=dtype)
    defaults = model_defaults(model, "builtin")
    fill_defaults(args, defaults)
    default_window(args, defaults, fixed_window)
    items = class_items(args.classes, model.classes)
    if items is not None and not items:
        shown = ",".join(args.classes) if isinstance(args.classes, list) else args.classes
        raise ValueError(f"--class {shown!r}: no class given; allowed: class names (any case), indices or random, "
                         f"comma-separated (leave --class out for the default classes; --list-classes lists them)")
    count = args.num_images or 8
    if items is None and not spread and getattr(model, "default_classes", None):
        items = model.default_classes  # the weights' own choice: different classes it draws well
    ids = model.classes.assign(items, count, seed=getattr(args, "seed", 0),
                               default="spread" if spread else "turn")  # raises on an unknown class
    if args.classes is not None and items is not None and len(items) > count:
        left = [str(item) for item in items[count:]]
        shown = ", ".join(repr(item) for item in left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
        note(f"--class names {len(items)} classes but -n {count} draws {count} image{'s' if count > 1 else ''}: "
             f"{shown} not drawn (-n {len(items)} draws every class named)")
    args.window = clamp_window(args.window, model.num_image_tokens)
    return model, ids


def refuse_builtin_device_map(args) -> None:
    """``--device-map`` with the built-in model: one line (it is not read by from_pretrained; it fits one device)."""
    if getattr(args, "device_map", None) is not None:
        raise ValueError("--device-map needs --model (a checkpoint folder); the built-in model (about 40 MB) runs on "
                         "one device: use --device")


def cap_builtin_batch(args, model, window: int, guided: bool, num_images: int,
                      tree: tuple[int, int] | None = None) -> int:
    """``--batch-size`` lowered to the number of images and to what memory allows (with a note); ``tree``:
    ``--tree``'s ``(K, D)``, whose nodes every forward feeds (:func:`csdgen.runs.builtin_bytes_per_image`)."""
    from csdgen.models.memory_check import available_memory
    from csdgen.runs import builtin_batch_limit

    limit = builtin_batch_limit(model, window, guided, available_memory(model.device), tree=tree)
    batch = min(args.batch_size, num_images)
    if batch > limit:
        note(f"--batch-size {args.batch_size}: about {limit} images fit in half the free memory of "
             f"{model.device.type}; using batches of {limit}")
        batch = limit
    return batch


def check_gsd_radii(radii, model) -> None:
    """``--gsd-radius`` values above ``V - 1`` refused (a radius of ``V - 1`` already spans every rank;
    GSD's candidates grow with it, so 100000 ran for minutes), as ``--top-k`` above V is: sweep's
    grid and generate's one value.

    Raises:
        ValueError: naming the option, the first value too large and the allowed range.
    """
    V = model.codebook_size
    over = [r for r in radii if r > V - 1]
    if over:
        raise ValueError(f"--gsd-radius {over[0]}: the GSD rank radius must be 0..{V - 1} (the codebook has V={V} tokens)")


def refuse_unfit_tree(plan) -> None:
    """One line when a draft tree makes even one image too large for the free memory
    (:meth:`csdgen.models.memory.MemoryPlan.largest_batch` 0; a plan without a tree or free figure passes).

    Raises:
        ValueError: naming the tree, its nodes a forward, the plan's bytes of one image and the free memory.
    """
    from csdgen.models.memory import format_bytes

    largest = None if plan.tree is None else plan.largest_batch()
    if largest is None or largest >= 1:
        return
    K, D, S = plan.tree
    usable = int(plan.free * (1 - plan.headroom))
    raise ValueError(f"--tree {K},{D} at window {plan.window} feeds {S} nodes a forward: one image needs about "
                     f"{format_bytes(plan.peak(1))} (memory plan) but {plan.device} has {format_bytes(plan.free)} free "
                     f"({format_bytes(usable)} after keeping {plan.headroom:.0%} free); allowed: a smaller tree "
                     f"(fewer candidates K or levels D) or window")


def require_decoder(model, name, folder: Path) -> None:
    """:func:`csdgen.models.auto.require_decoder` (one line naming the decoder files a checkpoint lacks)."""
    from csdgen.models.auto import require_decoder as check

    check(model, name, folder)


#: printed once when --temperature 0 is given with --model
GREEDY_WARNING = ("--temperature 0 is greedy decoding, known to give flat or black images on these "
                  "models; use it for checks (greedy equivalence), sample with the family's temperature for pictures")


def checkpoint_setup(args, *, fixed_window: bool):
    """``--model``'s start-up, shared by the commands: folder, family, defaults, sampling.

    Resolves and checks the checkpoint folder (:func:`csdgen.models.detect.read_config`: one line
    for what is wrong), fills the options left out from the family's defaults (window: fixed or
    ``auto``), adds the family's guidance schedule unless ``--guidance-schedule constant``, and
    prints :data:`GREEDY_WARNING` once for ``--temperature 0``.

    Returns:
        ``(folder, family, sampling)``.
    """
    from dataclasses import asdict

    from csdgen.models.defaults import FAMILY_DEFAULTS
    from csdgen.models.detect import family_of, read_config
    from csdgen.models.sources import resolve_checkpoint

    if args.weights is not None:
        raise ValueError("--weights is for the built-in model; with --model the checkpoint folder holds the weights")
    apply_preset(args)
    folder = resolve_checkpoint(args.model)
    read_config(folder)
    family = family_of(folder, args.layout, args.model)
    fill_defaults(args, asdict(FAMILY_DEFAULTS[family]))
    default_window(args, asdict(FAMILY_DEFAULTS[family]), fixed=fixed_window)
    sampling = sampling_of(args)
    if family == "glm-image" and sampling.guided:  # before the weights are read (GlmImageModel.start refuses too)
        refuse_guided_glm_image(args.guidance_scale)
    if family == "liquid" and args.guidance_scale < 1:  # the library runs it unguided, as Liquid's reference does
        note(f"--guidance-scale {args.guidance_scale:g}: Liquid's reference guides only above 1; this run decodes "
             f"the conditional rows alone, as at --guidance-scale 1")
    if getattr(args, "guidance_schedule", "family") == "family":
        from dataclasses import replace

        from csdgen.models.detect import family_guidance

        sampling = replace(sampling, guidance_schedule=family_guidance(family))
        floor = getattr(sampling.guidance_schedule, "floor", None)
        if sampling.guided and floor is not None and args.guidance_scale < floor:
            note(f"--guidance-scale {args.guidance_scale:g} is below the family schedule's floor {floor:g}: every "
                 f"position guides with {floor:g} (--guidance-schedule constant keeps {args.guidance_scale:g})")
    if args.temperature == 0:
        print(f"{prefix()}: warning: {GREEDY_WARNING}", file=sys.stderr)
    return folder, family, sampling


def refuse_guided_glm_image(scale: float) -> None:
    """GLM-Image's AR prior has no classifier-free guidance: any scale but 1 is refused (``generate`` and ``plan``).

    Raises:
        ValueError: naming the scale and what is allowed.
    """
    raise ValueError(f"--guidance-scale {scale:g}: GLM-Image's AR prior runs without classifier-free "
                     f"guidance (diffusers samples it unguided); allowed: 1")


@contextlib.contextmanager
def locked_runs(model, jobs, classes, args, sampling, out, command: str):
    """Hold ``out``'s lock (:func:`csdgen.folder_lock.folder_lock`, by ``csdgen COMMAND``), run
    :func:`csdgen.runs.run_methods` of ``jobs`` over ``classes`` into it with a progress bar, and yield
    the runs: what the caller writes from them in the ``with`` block is written under the lock too.

    Raises:
        csdgen.folder_lock.FolderBusy: another command writes into ``out`` now.
    """
    from tqdm import tqdm

    from csdgen.folder_lock import folder_lock
    from csdgen.runs import run_methods

    with folder_lock(out, f"csdgen {command}"):
        with tqdm(total=len(jobs) * len(classes), unit="img", desc=command, disable=None) as bar:
            runs = run_methods(model, jobs, classes, batch_size=args.batch_size, sampling=sampling, out_dir=out,
                               progress=bar.update)
        yield runs
