"""Options the commands share: argument types, option groups, and what ``--help`` shows.

Nothing here imports torch or transformers: building the parser, ``--help`` and usage errors
stay fast. The choice lists below equal the engine's (``csdgen.engine.METHODS``,
``csdgen.drafting.DRAFT_INITS`` / ``REFRESH_MODES``; a test checks it), and the defaults shown
in ``--help`` are read from ``csdgen/models/defaults.py`` and the shipped built-in
``config.json`` without importing the package's model code.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import sys
from pathlib import Path

METHODS = ("ar", "sjd", "csd", "addition", "jacobi", "gsd", "lantern")
DRAFT_INITS = ("uniform", "onehot", "repeat-horizontal", "repeat-vertical")
ONE_HOT_INITS = ("onehot", "repeat-horizontal", "repeat-vertical")  # csdgen.drafting.ONE_HOT_INITS
REFRESH_MODES = ("independent", "coupled")
ENTROPY_UNITS = ("nats", "normalized")
GUIDANCE_SCHEDULES = ("family", "constant")  # csdgen.serve.schemas.GUIDANCE_SCHEDULES (not imported: --help stays free of torch)
DEVICES = ("cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")  # csdgen.models.dtypes.DTYPE_CHOICES (not imported: --help stays free of torch)
ENGINES = ("auto", "static", "eager")  # csdgen.models._static.ENGINES (not imported: --help stays free of torch)
#: method names of ``csdgen compare`` and ``csdgen bench --methods`` (``csdgen.evaluation.compare.method_presets``;
#: gsd and lantern with a codebook)
COMPARE_METHODS = ("ar", "sjd", "sjd-coupled", "jacobi", "addition", "gsd", "lantern", "csd", "csd-coupled")

_PACKAGE = Path(__file__).resolve().parents[1]
BUILTIN_CONFIG = _PACKAGE / "builtin" / "weights" / "config.json"


def builtin_class_names() -> list[str]:
    """Class names of the shipped built-in model (read from its config.json; [] if absent)."""
    try:
        return list(json.loads(BUILTIN_CONFIG.read_text())["class_names"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def class_lookup(weights: Path | None = None):
    """The :class:`csdgen.class_names.ClassNames` of the built-in model's config.json (``weights``
    folder, default the shipped one), read without loading the model (no torch).

    Raises:
        FileNotFoundError: no config.json there. ValueError: a malformed config (naming the file).
    """
    from csdgen.class_names import ClassNames
    from csdgen.jsonio import read_json

    path = (BUILTIN_CONFIG if weights is None else Path(weights) / "config.json")
    if weights is not None and not path.is_file():
        raise FileNotFoundError(f"--weights {str(weights)!r}: no config.json there (a built-in weights folder has "
                                f"config.json and *.safetensors)")
    config = read_json(path, what="the built-in model's config")
    if not isinstance(config.get("class_names"), list):
        raise ValueError(f"{str(path)!r} has no class_names list")
    try:
        return ClassNames.from_config(config)
    except ValueError as exc:
        raise ValueError(f"{str(path)!r}: {exc}") from None


def _defaults_module():
    """``csdgen/models/defaults.py`` without importing torch (loaded alone when the package is not imported)."""
    module = sys.modules.get("csdgen.models.defaults") or sys.modules.get("_csdgen_help_defaults")
    if module is None:
        spec = importlib.util.spec_from_file_location("_csdgen_help_defaults", _PACKAGE / "models" / "defaults.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while building the class
        spec.loader.exec_module(module)
    return module


def family_defaults(family: str):
    """``FAMILY_DEFAULTS[family]`` without importing torch."""
    return _defaults_module().FAMILY_DEFAULTS[family]


def method_refresh(method: str) -> str:
    """A method's default refresh (``csdgen.models.defaults.METHOD_REFRESH``) without importing torch."""
    return _defaults_module().method_refresh(method)


def presets() -> dict:
    """``csdgen.models.defaults.PRESETS`` without importing torch."""
    return _defaults_module().PRESETS


def method_draft_init(method: str) -> str | None:
    """The draft initialisation ``method``'s rule needs (``csdgen.models.defaults.METHOD_DRAFT_INIT``;
    None: any) without importing torch."""
    return _defaults_module().METHOD_DRAFT_INIT.get(method)


# ---- argument types (their names appear in argparse's messages, so each raises its own line) ----

#: the most images one command makes (-n, --limit, --batch-size): a typo such as 10**20 is refused at once
#: instead of building a list of that length
MAX_IMAGES = 1_000_000
#: the largest --offset (image indices stay far inside int64)
MAX_OFFSET = 10**12


def _int(text: str) -> int:
    """``int(text)`` for ASCII digits only (Python's ``int`` also reads other scripts' digits, so
    ``--limit ١`` ran as 1); ValueError otherwise."""
    if not text.strip().isascii():
        raise ValueError(text)
    return int(text)


def path_text(text: str) -> str:
    """A path or name given on the command line: not empty (``Path("")`` is the current folder, so
    ``--weights ''`` looked for weights in ``.``)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: an empty path; allowed: a file or folder path (or leave the option out)")
    return text


def model_or_builtin(text: str) -> str | None:
    """``--model`` of the commands whose default is the built-in model: ``builtin`` is that default
    (None, as bench, compare and plan take it), else a checkpoint path or repo id (:func:`path_text`)."""
    return None if text.strip() == "builtin" else path_text(text)


def prompt_text(text: str) -> str:
    """Prompt text given on the command line: refused with the byte when the shell passed bytes that
    are not UTF-8 (:func:`csdgen.prompts.check_text`), which no tokenizer takes."""
    from csdgen.prompts import check_text

    try:
        return check_text(text, "the text")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def path(text: str) -> Path:
    """:func:`path_text` as a ``Path``."""
    return Path(path_text(text))


def count(minimum: int = 1, what: str = "", maximum: int = MAX_IMAGES):
    """An integer in ``minimum .. maximum`` (``what`` says why the minimum, e.g. for compare's -n >= 2)."""
    def integer(text: str) -> int:
        try:
            value = _int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer in {minimum}..{maximum}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value}: must be an integer >= {minimum}{what}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{value}: allowed at most {maximum}")
        return value
    integer.__name__ = "integer"
    return integer


def real(low: float = 0.0, high: float = float("inf"), *, low_open: bool = False, high_open: bool = True,
         allowed: str = ""):
    """A finite number in ``low .. high`` (``low_open`` / ``high_open``: the bound itself refused); a bad
    value's message says ``allowed`` (default: the interval, e.g. ``a number in [0, 1)``)."""
    allowed = allowed or f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def number_in(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        inside = (low < value if low_open else low <= value) and (value < high if high_open else value <= high)
        if not inside or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"{text!r}: allowed {allowed}")
        return value
    number_in.__name__ = "number"
    return number_in


def port(minimum: int):
    """A TCP port in ``minimum .. 65535`` (``minimum`` 0: 0 asks the system for any free port)."""
    note = " (0: any free port)" if minimum == 0 else ""

    def tcp_port(text: str) -> int:
        try:
            value = _int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: must be a TCP port, an integer in {minimum}..65535{note}") from None
        if not minimum <= value <= 65535:
            raise argparse.ArgumentTypeError(f"{value}: must be a TCP port in {minimum}..65535{note}")
        return value
    tcp_port.__name__ = "port"
    return tcp_port


#: the seed range (``csdgen.sampling.MAX_SEED``, repeated here so that the parser imports no torch)
MAX_SEED = 2**63 - 1


def seed(text: str, top: int = MAX_SEED) -> int:
    """A run seed: an integer in 0 .. ``top`` (default 2**63 - 1: larger ones would alias smaller ones'
    random streams; a command that also runs seed + 1 takes one less)."""
    shown = f"{top} (2**63 - {2**63 - top})"
    try:
        value = _int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer seed in 0..{shown}") from None
    if not 0 <= value <= top:
        raise argparse.ArgumentTypeError(f"{value}: outside the seed range; allowed: an integer in 0..{shown}")
    return value


def items(text: str, allowed: str) -> list[str]:
    """The comma-separated items of ``text``, stripped; ``[]`` for an empty string (the callers say whether
    none is allowed). An empty item (``0.5,,1``, ``16,``) is refused, the message saying ``allowed``: the
    user probably meant a value there."""
    if not text.strip():
        return []
    values = [v.strip() for v in text.split(",")]
    if "" in values:
        raise argparse.ArgumentTypeError(f"{text!r}: an empty item; allowed: {allowed}")
    return values


def seeds(text: str) -> list[int]:
    """Comma-separated run seeds, each in 0 .. 2**63 - 1, no repeats (a repeat would run every image twice)."""
    values = [seed(v) for v in items(text, f"integer seeds in 0..{MAX_SEED}, comma-separated")]
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{text!r}: seed {repeated[0]} is given twice; allowed: distinct seeds")
    return values


def window(text: str) -> int | str:
    """``--window``: an integer >= 1, or "auto" (the engine picks each iteration's width from measured
    times; ``bench`` refuses it after parsing, with its reason)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return count()(text)
    except argparse.ArgumentTypeError:  # one wording for every bad value, naming auto too
        raise argparse.ArgumentTypeError(f"{text.strip()!r}: allowed an integer in 1..{MAX_IMAGES} or auto") from None


MAX_TREE_LEAVES = 4096  #: K**D's bound (csdgen.trees.check_tree)


def tree_shape(text: str) -> tuple[int, int] | None:
    """``--tree K,D``: two integers >= 1 (candidates per level, tree levels) with ``K**D <= 4096``, e.g. ``3,2``;
    None for ``K = 1``, the plain window (as :func:`csdgen.trees.check_tree`)."""
    parts = text.replace("x", ",").split(",")
    try:
        k, d = (int(v) for v in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected K,D with two integers >= 1, e.g. 3,2") from None
    if k < 1 or d < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: K and D must be integers >= 1, e.g. 3,2")
    if k > 1 and (d > MAX_TREE_LEAVES.bit_length() or k**d > MAX_TREE_LEAVES):  # csdgen.trees.check_tree's bound,
        # refused here before the model loads (d checked first: 10**5 ** 10**7 would take minutes to compute)
        raise argparse.ArgumentTypeError(f"{text!r}: a tree of {k}**{d} leaves; allowed K**D <= {MAX_TREE_LEAVES}, e.g. 3,2")
    return None if k == 1 else (k, d)


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number") from None


def top_k(text: str) -> int:
    """``--top-k``: an integer >= 1, or 0 / "none" for no top-k (kept as 0 until defaults are filled)."""
    if text.strip().lower() == "none":
        return 0
    try:
        value = _int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 1, or 0 / none for no top-k") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: expected an integer >= 1, or 0 / none for no top-k")
    return value


def _repeated(values: list, text: str, what: str) -> None:
    """Refuse a value listed twice (it would run twice and print duplicate rows)."""
    repeated = [v for i, v in enumerate(values) if v in values[:i]]
    if repeated:
        raise argparse.ArgumentTypeError(f"{text!r}: {what} {repeated[0]!r} is given twice; allowed: distinct values")


def one_of(allowed: tuple[str, ...], what: str):
    """One name of ``allowed`` in any case (the library takes ``method="CSD"``); the error repeats the
    name as given (argparse's ``choices`` after ``type=str.lower`` echoed it lower-cased)."""
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in allowed:
            raise argparse.ArgumentTypeError(f"unknown {what} {text!r}; allowed: {', '.join(allowed)} (any case)")
        return value
    parse.__name__ = what.replace(" ", "_")
    return parse


def add_method(p) -> None:
    """``--method``: one of :data:`METHODS` in any case (:func:`one_of`), default csd; the help lists them."""
    p.add_argument("--method", type=one_of(METHODS, "method"), metavar="{" + ",".join(METHODS) + "}", default="csd",
                   help="decoding method (default csd)")


def names_of(allowed: tuple[str, ...] | list[str], what: str, empty: bool = False):
    """Comma-separated names, each one of ``allowed``, none twice (``empty``: an empty string = none,
    else an empty list is refused)."""
    def parse(text: str) -> list[str]:
        values = items(text, f"{', '.join(allowed)}, comma-separated")
        bad = [v for v in values if v not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(map(repr, bad))}; allowed: {', '.join(allowed)}")
        if not values and not empty:
            raise argparse.ArgumentTypeError(f"{text!r}: no {what} given; allowed: {', '.join(allowed)}, comma-separated")
        _repeated(values, text, what)
        return values
    parse.__name__ = what.replace(" ", "_")
    return parse


def numbers(kind, empty: bool = True, what: str = "value", check=None, allowed: str = "", distinct: bool = True):
    """Comma-separated numbers of ``kind``, none twice unless ``distinct`` is False (an empty string =
    none, unless ``empty`` is False: then at least one ``what`` is asked for); ``check(value)`` False
    (or a non-finite float) refuses the value, the message saying ``allowed`` (a sweep's grid is
    checked before any model loads)."""
    def parse(text: str) -> list:
        given = items(text, f"{allowed or kind.__name__ + ' values'}, comma-separated")
        try:
            values = [kind(v) for v in given]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated {kind.__name__} values") from None
        if not values and not empty:
            raise argparse.ArgumentTypeError(f"{text!r}: no {what} given; allowed: at least one, comma-separated, e.g. 16,32")
        if check is not None:
            bad = [v for v in values if not (math.isfinite(v) and check(v))]
            if bad:
                raise argparse.ArgumentTypeError(f"{text!r}: {what} {bad[0]!r} is out of range; allowed: {allowed}, comma-separated")
        if distinct:
            _repeated(values, text, "value")
        return values
    parse.__name__ = f"{kind.__name__}_list"
    return parse


def window_list(text: str) -> list[int]:
    """``sweep --windows``: comma-separated windows, each an integer in 1 .. :data:`MAX_IMAGES`, none twice,
    at least one. ``auto`` is not swept: a sweep compares fixed windows (auto picks its width from timing)."""
    allowed = "allowed: integers >= 1, comma-separated, e.g. 16,32 (auto is not swept: a sweep compares fixed windows)"
    values = []
    for item in items(text, allowed[9:]):
        try:
            value = _int(item)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: window {item!r} is not an integer; {allowed}") from None
        if not 1 <= value <= MAX_IMAGES:
            raise argparse.ArgumentTypeError(f"{text!r}: window {value} is out of range; {allowed.replace('>= 1', f'in 1..{MAX_IMAGES}')}")
        values.append(value)
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r}: no window given; allowed: at least one, {allowed[9:]}")
    _repeated(values, text, "value")
    return values


def folder(text: str) -> Path:
    """An output folder: a non-empty path (an empty ``--out`` would write into the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: an empty output folder; allowed: a folder path, e.g. --out outputs")
    return Path(text)


# ---- option groups ----

def add_builtin_model(p: argparse.ArgumentParser, *, n_default: str, batch_default: int, out_default: str,
                      n_minimum: int = 1, checkpoints: bool = False, spread: bool = False,
                      seed_max: int = MAX_SEED, seed_note: str = "") -> None:
    """The built-in model, its classes, the image count, seed, batch size, device and output folder
    (``spread``: the default classes are spread over the categories, for measurements; ``seed_max``:
    the largest seed the command takes, ``seed_note`` why, for ``--help``)."""
    classes = builtin_class_names()
    example = next((n for n in ("red apple", "dog face") if n in classes), classes[0] if classes else "")
    shipped = (f"the {len(classes):,} classes of the shipped model, e.g. {example!r}; " if classes else "")
    default = ("classes spread over all the categories, in a fixed order" if spread
               else "the model's default classes, different ones it draws well")
    p.add_argument("--weights", type=path, default=None, help="built-in model weights folder (default: shipped with csdgen)")
    p.add_argument("--class", dest="classes", action="append", default=None, metavar="NAMES",
                   help=f"built-in class names ({shipped}any case and spacing, an emoji's short name or the emoji itself), "
                        f"indices, or random (a class drawn from --seed per image); comma-separated (a name "
                        f"holding commas, as a retrained model's may, stays whole: the longest name wins) or "
                        f"repeated, taken in turn (default: {default}). List them: --list-classes")
    p.add_argument("--list-classes", nargs="?", const="", default=None, metavar="CATEGORY",
                   help="print the built-in model's classes by category (index, name, short names) and exit; "
                        "CATEGORY (any part of its name, e.g. food) prints one category")
    why = " (the Frechet distance compares sets of images)" if n_minimum > 1 else ""
    p.add_argument("-n", "--num-images", type=count(n_minimum, why), default=None, metavar="N",
                   help=f"number of images (default {n_default})")
    p.add_argument("--seed", type=functools.partial(seed, top=seed_max), default=0,
                   help=f"run seed, 0..{seed_max}{': ' + seed_note if seed_note else ''} (default 0)")
    p.add_argument("--batch-size", type=count(), default=batch_default, metavar="B",
                   help=f"images per batch (default {batch_default}; the built-in model's lowered to what memory allows"
                        + ("; with --model one memory does not hold is refused, naming the largest that fits)"
                           if checkpoints else ")"))
    p.add_argument("--device", choices=DEVICES, default=None,
                   help="default cpu" + ("; with --model cuda when available" if checkpoints else ""))
    p.add_argument("--out", type=folder, default=Path(out_default), help=f"output folder (default ./{out_default})")


def add_sampling(p: argparse.ArgumentParser, *, family_note: bool = False) -> None:
    """Guidance scale, temperature, top-k, top-p and CSD's entropy unit (defaults: the model's)."""
    d = family_defaults("builtin")
    also = "; with --model the family's" if family_note else ""
    p.add_argument("--guidance-scale", type=number, default=None, metavar="S",
                   help=f"classifier-free guidance scale (default: the model's; built-in {d.guidance_scale:g}{also})")
    p.add_argument("--temperature", type=number, default=None, metavar="T",
                   help=f"0 = greedy (default: the model's; built-in {d.temperature:g}{also})")
    p.add_argument("--top-k", type=top_k, default=None, metavar="K",
                   help=f"0 or none = no top-k (default: the model's; built-in "
                        f"{'none' if d.top_k is None else d.top_k}{also})")
    p.add_argument("--top-p", type=number, default=None, metavar="P",
                   help=f"nucleus mass in (0, 1], 1 = no top-p (default: the model's; built-in "
                        f"{'none' if d.top_p is None else d.top_p}{also})")
    if family_note:
        p.add_argument("--guidance-schedule", choices=GUIDANCE_SCHEDULES, default="family",
                       help="family: the family's own schedule of the guidance scale over the image (Lumina-mGPT 2.0's "
                            "max(4, g (1 - n/D)) per token), constant elsewhere; constant: the scale at every "
                            "position (default family)")
    p.add_argument("--entropy-unit", choices=ENTROPY_UNITS, default="nats",
                   help="CSD's entropy: nats (the paper's) or normalized by ln V (default nats)")


def add_preset(p: argparse.ArgumentParser) -> None:
    """``--preset paper``: the CSD paper's settings for every option left out."""
    table = presets()
    paper = table["paper"]
    p.add_argument("--preset", choices=list(table), default=None,
                   help=f"paper = the CSD paper's settings for every option left out: --window {paper['window']}, "
                        f"--draft-init {paper['draft_init']}, {paper['refresh']} refresh, --lam {paper['lam']:g}, "
                        f"--delta {paper['delta']:g} (default: none; options given win)")


def add_method_options(p: argparse.ArgumentParser, *, family_note: bool = False, fixed_window: bool = False,
                       auto: bool = True, served: bool = False) -> None:
    """Window, CSD lambda and delta, Addition's c and the draft initialisation of one run (``auto``:
    whether ``--window auto`` is offered; bench refuses it; ``served``: the help speaks of requests,
    not of ``--batch-size``)."""
    d = family_defaults("builtin")
    also = "; with --model the family's" if family_note else ""
    rerun = ("a fixed W gives a request's images the tokens csdgen.generate gives them alone, whatever is "
             "batched beside them, but where float32 rounding tips a decision (docs/serve.md)" if served else
             "a fixed W gives the same images on a rerun with the same --batch-size and thread count, and another "
             "--batch-size changes them only where float32 summation order tips a decision (docs/library.md, Batches)")
    default = (f"default {d.window}, the built-in model's measured window" if fixed_window else
               "default auto: the engine picks 1..32 per iteration from measured times, so images are "
               f"reproducible in distribution only; {rerun}")
    p.add_argument("--window", type=window, default=None, metavar="W",
                   help=f"Jacobi window: draft tokens verified per forward (clamped to the image length)"
                        f"{', or auto' if auto else ' (auto is refused: the images would depend on timing)'} ({default})")
    # ranges checked here, as csdgen.acceptance checks them, so that a bad value is one error even where the
    # method does not use the option (not a note that it is unused, then the rule's error)
    p.add_argument("--lam", type=real(allowed="a finite number >= 0 (CSD's relaxation coefficient lambda)"),
                   default=None, help=f"CSD lambda (default: the model's; built-in {d.lam:g}{also})")
    p.add_argument("--delta", type=real(0.0, 1.0, high_open=False, allowed="a number in [0, 1] (CSD's total-variation "
                                                                           "threshold)"), default=None,
                   help=f"CSD total-variation threshold (default: the model's; built-in {d.delta:g}{also})")
    p.add_argument("--addition-c", type=real(allowed="a finite number >= 0 (the Addition constant)"), default=0.2,
                   metavar="C", help="constant of the Addition rule (default 0.2)")
    add_engine(p)
    p.add_argument("--draft-init", choices=DRAFT_INITS, default=None,
                   help="draft initialisation (default: what the method needs, else uniform, the CSD reference)")


def add_rule_options(p) -> None:
    """``--gsd-radius`` and ``--lantern-delta``: GSD's and LANTERN's one option each (an argparse group or
    parser; the radius's upper bound, ``V - 1``, is checked once the model's codebook is known)."""
    p.add_argument("--gsd-radius", type=count(0, maximum=1 << 20), default=None, metavar="R",
                   help="GSD's rank radius, an integer >= 0 (default: the rule's, 7; --method gsd)")
    p.add_argument("--lantern-delta", type=real(0.0, 1.0, high_open=False, allowed="a number in [0, 1] "
                                                                               "(LANTERN's added-mass budget)"),
                   default=None, metavar="D", help="LANTERN's added-mass budget in [0, 1] (default: the rule's, 0.1; "
                                                   "--method lantern)")


def add_checkpoint_files(g) -> None:
    """``--image-size`` and ``--vqgan`` of the commands that take ``--model`` (an argparse group or parser)."""
    g.add_argument("--image-size", type=count(), default=None,
                   help="square image side in pixels (Lumina-mGPT: default the size its name says, e.g. "
                        "Lumina-mGPT-7B-768, else required)")
    g.add_argument("--vqgan", type=path_text, default=None, metavar="PATH",
                   help="the image decoder's files. Lumina-mGPT, Anole and Liquid: Chameleon's VQGAN, its tokenizer/ "
                        "folder holding vqgan.yaml and vqgan.ckpt (or the vqgan.ckpt file); default: found in the "
                        "checkpoint folder or its tokenizer/ (Liquid: also chameleon/). Lumina-mGPT 2.0: "
                        "movqgan_270M.ckpt or its folder; default: the checkpoint folder, movqgan/ or movqgan/270M/. "
                        "Decodes images, and gives GSD/LANTERN the codebook Lumina-mGPT's files lack")


def add_checkpoint_options(g) -> None:
    """A checkpoint's layout, size, weight files, Emu3's prompts, the prompt template and the dtype
    (``--model`` runs of ``generate`` and ``bench``)."""
    add_layout(g)
    g.add_argument("--height", type=count(), default=None, help="image height in pixels (default: the family's)")
    g.add_argument("--width", type=count(), default=None, help="image width in pixels (default: the family's)")
    add_checkpoint_files(g)
    g.add_argument("--negative-prompt", type=prompt_text, default=None, help="Emu3: prompt of the unconditional rows (default Emu3's own)")
    g.add_argument("--positive-prompt", type=prompt_text, default=None,
                   help="Emu3: text appended to every prompt (default Emu3's ' masterpiece, film grained, best quality.'; "
                        "'' = off)")
    g.add_argument("--prompt-template", type=prompt_text, default=None,
                   help="template for each prompt with {prompt}, {width}, {height} (default: the family's, docs/models.md; "
                        "'{prompt}' = none)")
    add_dtype(g)


def add_layout(g) -> None:
    """``--layout``: which Chameleon-format family a ``--model`` folder is (Lumina-mGPT or Anole share the
    vocabulary, so the folder cannot always tell: :func:`csdgen.models.detect.guess_layout`)."""
    g.add_argument("--layout", choices=["lumina", "anole"], default=None,
                   help="--model Chameleon checkpoints: lumina (Lumina-mGPT) or anole (default: guessed from config.json "
                        "and the folder's name)")


def add_dtype(g) -> None:
    """``--dtype``: one of :data:`DTYPES` in any case (default None = auto: :func:`csdgen.models.dtypes.resolve_dtype`)."""
    g.add_argument("--dtype", type=one_of(DTYPES, "dtype"), metavar="{" + ",".join(DTYPES) + "}", default=None,
                   help="the model's dtype (default auto: on cuda the family's reference dtype, bfloat16 for every "
                        "released family; float32 on cpu and for the built-in model, which also takes bfloat16); the acceptance "
                        "arithmetic is float32 whatever the model's dtype")


#: ``--quantize`` values (csdgen.models.quantize.QUANTIZE_CHOICES; a test keeps the two the same, this
#: module imports no torch)
QUANTIZE = ("int8", "int4", "fp8", "nf4", "bnb8")


def device_map(text: str):
    """``--device-map``: auto, balanced, balanced_low_0, sequential or a JSON object module -> device."""
    from csdgen.models.quantize import parse_device_map

    try:
        return parse_device_map(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--device-map {text}: ")) from None


def add_quantize(g) -> None:
    """``--quantize`` and ``--device-map`` (:mod:`csdgen.models.quantize`)."""
    g.add_argument("--quantize", type=one_of(QUANTIZE, "quantisation"), metavar="{" + ",".join(QUANTIZE) + "}",
                   default=None,
                   help="quantise the language model's decoder layers while loading: int8 / int4 / fp8 weight-only "
                        "(torchao; int4 on cuda only, fp8 on cpu and cuda 8.9+), nf4 / bnb8 (bitsandbytes); the VQ "
                        "decoder and vision tower keep --dtype. Needs pip install -c constraints.txt \".[quant]\". Speculative "
                        "decoding stays exact for the quantised model (docs/models.md)")
    g.add_argument("--device-map", type=device_map, default=None, metavar="MAP",
                   help="--model: split the model across devices with accelerate: auto, balanced, sequential or a JSON "
                        "object of module -> device (\"cpu\", \"cuda:1\", \"disk\"); runs on the eager engine")


def add_engine(p: argparse.ArgumentParser) -> None:
    """The decoding engine (``generate(engine=..., compile=...)``)."""
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="static: preallocated per-row KV cache, window buckets (docs/engine.md); eager: the model's "
                        "own session (DynamicCache); default auto: static wherever it applies")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="compile the static engine's forwards per shape (CUDA graphs on CUDA); the first call of "
                        "each shape pays the compilation (default: on CUDA only)")


def engine_kwargs(args) -> dict:
    """``engine`` / ``compile`` for :func:`csdgen.generate`, only where not the defaults (so run keys
    and presets written before --engine existed stay the same)."""
    out = {}
    if getattr(args, "engine", "auto") != "auto":
        out["engine"] = args.engine
    if getattr(args, "compile", None) is not None:
        out["compile"] = args.compile
    return out
