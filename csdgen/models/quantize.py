"""Quantised weights and models split across devices, through transformers' and accelerate's own machinery.

Speculative decoding is exact for whatever target it is given: a quantised model is simply
another target (its own distribution), so SJD / CSD stay lossless against AR on the same
quantised model. Nothing here writes kernels: the weights are quantised by transformers'
quantisation configs when the checkpoint is read (``TorchAoConfig``, ``BitsAndBytesConfig``),
or, for a model built in memory (the built-in model), by torchao's ``quantize_``.

What ``quantize`` accepts (:data:`QUANTIZE_CHOICES`):

* ``int8``: torchao int8 weight-only (per output channel scale), CPU and CUDA;
* ``int4``: torchao int4 weight-only (groups of 128), CUDA only;
* ``fp8``: torchao float8 weight-only, CPU and CUDA of compute capability 8.9 or newer;
* ``nf4``: bitsandbytes 4-bit NormalFloat; ``bnb8``: bitsandbytes LLM.int8() (where
  bitsandbytes runs: CUDA, and its CPU backend).

Only the language model's decoder layers are quantised: every linear layer outside them (the
vision tower, the VQ decoder, generation heads, ``lm_head``) keeps the model's dtype
(:func:`skipped_modules`, handed to the config's ``modules_to_not_convert`` /
``llm_int8_skip_modules``).

``device_map`` (``"auto"``, ``"balanced"``, ``"sequential"`` or a JSON object module -> device)
goes to ``from_pretrained`` (accelerate dispatches the modules and moves activations between
them; transformers' cache keeps each layer's keys and values on that layer's device). Offload
to ``"disk"`` needs a folder: :func:`load_pretrained` makes a temporary one.

The family adapters load their transformers model with :func:`load_pretrained`;
:func:`load_options` (a context) says how, for :func:`csdgen.models.auto.load_model`.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from typing import Any, Iterator

import torch

__all__ = ["QUANTIZE_CHOICES", "DEVICE_MAP_CHOICES", "LoadOptions", "check_quantize", "parse_device_map",
           "load_options", "current_options", "load_pretrained", "skipped_modules", "decoder_layers_prefix",
           "quantize_module", "quantized_bits", "INSTALL_HINT"]

#: the values of ``quantize=`` / ``--quantize``
QUANTIZE_CHOICES = ("int8", "int4", "fp8", "nf4", "bnb8")
#: the named device maps (else a JSON object module name -> device)
DEVICE_MAP_CHOICES = ("auto", "balanced", "balanced_low_0", "sequential")
#: the install line of the optional packages
INSTALL_HINT = 'pip install -c constraints.txt ".[quant]" in the csdgen checkout'
#: bits per quantised weight element (the memory plan's arithmetic; scales counted separately)
_BITS = {"int8": 8, "int4": 4, "fp8": 8, "nf4": 4, "bnb8": 8}
#: torchao's int4 group size (transformers' and torchao's default)
INT4_GROUP = 128
#: bitsandbytes' 4-bit block size (one float32 absmax per block)
NF4_BLOCK = 64


def quantized_bits(name: str) -> int:
    """Bits per quantised weight element of ``name`` (a :data:`QUANTIZE_CHOICES` value)."""
    return _BITS[name]


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def check_quantize(name: str | None, device: str | torch.device) -> None:
    """Refuse a quantisation the device or the installed packages cannot run, in one line.

    Args:
        name: None (no quantisation) or a :data:`QUANTIZE_CHOICES` value; device: where the model runs.

    Raises:
        ValueError: an unknown name (naming the allowed ones), a package not installed (with
            :data:`INSTALL_HINT`), or a quantisation the device does not run (naming what it allows).
    """
    if name is None:
        return
    if name not in QUANTIZE_CHOICES:
        raise ValueError(f"--quantize {name}: allowed {', '.join(QUANTIZE_CHOICES)}")
    kind = torch.device(device).type
    if name in ("int8", "int4", "fp8"):
        if not _installed("torchao"):
            raise ValueError(f"--quantize {name}: torchao is not installed: {INSTALL_HINT}")
        if name == "int4" and kind != "cuda":
            raise ValueError(f"--quantize int4: torchao's int4 weight-only needs CUDA; on {kind} use int8")
        if name == "fp8" and kind == "cuda" and torch.cuda.get_device_capability(torch.device(device)) < (8, 9):
            major, minor = torch.cuda.get_device_capability(torch.device(device))
            raise ValueError(f"--quantize fp8: float8 needs a GPU of compute capability 8.9 or newer (this one is "
                             f"{major}.{minor}); use int8 or int4")
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"--quantize {name}: torchao's weight-only kernels run on cpu and cuda, not {kind}")
        return
    if not _installed("bitsandbytes"):
        raise ValueError(f"--quantize {name}: bitsandbytes is not installed: {INSTALL_HINT}")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"--quantize {name}: bitsandbytes runs on cuda (and cpu), not {kind}; use int8")


def check_in_memory_quantize(name: str | None, device: str | torch.device) -> None:
    """:func:`check_quantize` for a model built in memory (the built-in model, :func:`quantize_module`): ``nf4`` and
    ``bnb8`` are refused first, as what they are (bitsandbytes quantises only while reading a checkpoint folder),
    not as a package to install that would not help.

    Raises:
        ValueError: ``nf4`` / ``bnb8``, or what :func:`check_quantize` refuses.
    """
    if name in ("nf4", "bnb8"):
        raise ValueError(f"--quantize {name}: bitsandbytes quantises while reading a checkpoint folder; "
                         f"the built-in model takes int8, fp8" + ("" if torch.device(device).type == "cpu" else ", int4"))
    check_quantize(name, device)


def parse_device_map(text: str | dict | None) -> str | dict | None:
    """``--device-map`` text -> what ``from_pretrained(device_map=...)`` takes.

    Args:
        text: None; one of :data:`DEVICE_MAP_CHOICES`; a JSON object mapping module names to a
            device (``"cpu"``, ``"cuda"``, ``"cuda:0"``, ``0`` (CUDA device 0), ``"disk"``); or that dict.

    Raises:
        ValueError: anything else, or a CUDA device this machine does not have (one line naming the
            value and what is allowed).
    """
    if text is None:
        return text
    allowed = f"allowed {', '.join(DEVICE_MAP_CHOICES)} or a JSON object of module -> device, e.g. " \
              f"'{{\"model.layers.0\": \"cpu\", \"model.layers.1\": \"disk\"}}'"
    if isinstance(text, str) and text in DEVICE_MAP_CHOICES:
        return text
    if isinstance(text, dict):
        value, shown = text, json.dumps(text) if all(isinstance(k, str) for k in text) else repr(text)
    elif isinstance(text, str) and text.lstrip().startswith("{"):
        try:
            value, shown = json.loads(text), text
        except json.JSONDecodeError as exc:
            raise ValueError(f"--device-map {text}: not valid JSON ({exc.msg}); {allowed}") from None
    else:
        raise ValueError(f"--device-map {text}: {allowed}")
    bad = [f"{k!r}: {v!r}" for k, v in value.items() if not isinstance(k, str) or not (
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 or isinstance(v, str) and v)]
    if not value or bad:
        raise ValueError(f"--device-map {shown}: {'; '.join(bad) or 'empty'}; {allowed}")
    for module, place in value.items():
        problem = _device_problem(place)
        if problem:
            raise ValueError(f"--device-map {shown}: {module!r}: {place!r} {problem}")
    return value


def _device_problem(place: int | str) -> str:
    """Why ``place`` (a device map's value) cannot hold weights on this machine ("" when it can)."""
    if place == "disk":
        return ""
    try:
        device = torch.device("cuda", place) if isinstance(place, int) else torch.device(place)  # accelerate reads an int so
    except (RuntimeError, ValueError):
        return "is not a device; allowed 'cpu', 'disk', 'cuda', 'cuda:N' or N (CUDA device N)"
    if device.type == "cpu":
        return ""
    if device.type != "cuda":
        return "is not a device csdgen places weights on; allowed 'cpu', 'disk', 'cuda', 'cuda:N' or N"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        return "names a CUDA device and none is visible here; use 'cpu' or 'disk'"
    if device.index is not None and device.index >= count:
        return f"names CUDA device {device.index}; this machine has {count} (0..{count - 1})"
    return ""


@dataclass(frozen=True)
class LoadOptions:
    """How :func:`load_pretrained` reads a checkpoint's transformers model.

    Attributes:
        quantize: None or a :data:`QUANTIZE_CHOICES` value.
        device_map: None or what :func:`parse_device_map` returns.
        offload_folder: where ``"disk"`` modules go (None: a temporary folder when needed, removed with the
            model that uses it or when the process exits).
    """

    quantize: str | None = None
    device_map: str | dict | None = None
    offload_folder: str | None = None


_OPTIONS: contextvars.ContextVar[LoadOptions] = contextvars.ContextVar("csdgen_load_options", default=LoadOptions())


def current_options() -> LoadOptions:
    """The :class:`LoadOptions` in force (:func:`load_options`; default: none)."""
    return _OPTIONS.get()


@contextlib.contextmanager
def load_options(quantize: str | None = None, device_map: Any = None,
                 offload_folder: str | os.PathLike | None = None) -> Iterator[LoadOptions]:
    """Within the block, :func:`load_pretrained` quantises and dispatches as told.

    Raises:
        ValueError: a bad ``quantize`` or ``device_map`` (:func:`parse_device_map`).
    """
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize={quantize!r}: allowed {', '.join(QUANTIZE_CHOICES)} (or None)")
    options = LoadOptions(quantize, parse_device_map(device_map), None if offload_folder is None else str(offload_folder))
    token = _OPTIONS.set(options)
    try:
        yield options
    finally:
        _OPTIONS.reset(token)


def decoder_layers_prefix(model: torch.nn.Module) -> str:
    """The name of the language model's decoder layers (``"model.language_model.layers"``, ``"model.layers"``, ...):
    the ``layers`` of the module that also holds ``embed_tokens`` (a vision tower has no ``embed_tokens``).

    Raises:
        ValueError: no such module (the model is not a transformers decoder).
    """
    for name, module in model.named_modules():
        if hasattr(module, "embed_tokens") and isinstance(getattr(module, "layers", None), torch.nn.ModuleList):
            return f"{name}.layers" if name else "layers"
    raise ValueError(f"{type(model).__name__}: no language model (a module holding embed_tokens and layers) to quantise")


def skipped_modules(model: torch.nn.Module) -> list[str]:
    """Full names of the linear layers outside the language model's decoder layers (kept unquantised)."""
    prefix = decoder_layers_prefix(model) + "."
    return [name for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and not name.startswith(prefix)]


def _quiet_torchao():
    """Import torchao with its optional-kernel messages (CUDA-only libraries on a CPU machine) kept off the console."""
    logger = logging.getLogger("torchao")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import torchao.quantization as tq
    finally:
        logger.setLevel(level)
    return tq


def _torchao_config(name: str):
    tq = _quiet_torchao()
    if name == "int8":
        return tq.Int8WeightOnlyConfig()
    if name == "int4":
        return tq.Int4WeightOnlyConfig(group_size=INT4_GROUP)
    return tq.Float8WeightOnlyConfig()


def quantization_config(name: str, skip: list[str], dtype: torch.dtype):
    """The transformers quantisation config of ``name``, keeping the ``skip`` modules in ``dtype``."""
    if name in ("int8", "int4", "fp8"):
        from transformers import TorchAoConfig

        return TorchAoConfig(_torchao_config(name), modules_to_not_convert=skip or None)
    from transformers import BitsAndBytesConfig

    if name == "nf4":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype,
                                  llm_int8_skip_modules=skip or None)
    return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip or None)


def load_pretrained(model_class: Any, folder: str | os.PathLike, *, dtype: torch.dtype, device: str | torch.device,
                    **kwargs) -> torch.nn.Module:
    """``model_class.from_pretrained(folder, dtype=dtype)`` on ``device``, quantised and dispatched as
    :func:`current_options` says.

    Without options: ``from_pretrained(...).to(device)`` as before. With ``quantize``: the
    weights are quantised while they are read (the decoder layers only, :func:`skipped_modules`),
    straight onto ``device``. With ``device_map``: accelerate places the modules (``device``
    is then only the default for "auto"'s main device).

    Raises:
        ValueError: a quantisation the device or the installed packages cannot run
            (:func:`check_quantize`).
    """
    options = current_options()
    if options.quantize is None and options.device_map is None:
        return checked_from_pretrained(model_class, folder, dtype=dtype, **kwargs).to(device)
    extra: dict[str, Any] = {}
    if options.quantize is not None:
        check_quantize(options.quantize, device)
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            skeleton = model_class._from_config(config) if hasattr(model_class, "_from_config") else model_class(config)
        extra["quantization_config"] = quantization_config(options.quantize, skipped_modules(skeleton), dtype)
    device_map = options.device_map
    if isinstance(device_map, dict):
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            skeleton = model_class._from_config(config) if hasattr(model_class, "_from_config") else model_class(config)
        device_map = complete_device_map(skeleton, device_map, str(torch.device(device)))
        if options.quantize in ("int8", "int4", "fp8") and len(device_map) > 1 and \
                {"cpu", "disk"} & set(map(str, device_map.values())) and not torch.cuda.is_available():
            raise ValueError(f"--quantize {options.quantize} with --device-map placing modules on 'cpu' or 'disk': "
                             f"transformers quantises those layers on a GPU first (torchao offload), and none is visible "
                             f"here; use --device-map auto, or leave out --quantize or --device-map")
    if isinstance(device_map, dict) and "disk" in device_map.values():
        _check_offload(model_class, folder, device_map)
    if device_map is None:
        device_map = {"": str(torch.device(device))}
    extra["device_map"] = device_map
    own = None  # a temporary offload folder of this model's: removed with the model (or at exit)
    if _offloads(device_map):
        extra["offload_folder"] = options.offload_folder or (own := tempfile.mkdtemp(prefix="csdgen-offload-"))
    try:
        model = checked_from_pretrained(model_class, folder, dtype=dtype, **kwargs, **extra)
    except BaseException:
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)
        raise
    if own is not None:
        weakref.finalize(model, shutil.rmtree, own, ignore_errors=True)
    return model


def checked_from_pretrained(model_class: Any, folder: str | os.PathLike, **kwargs) -> torch.nn.Module:
    """``model_class.from_pretrained(folder, **kwargs)``, refusing weights that do not fit the folder's config.json.

    transformers initialises at random a weight the config asks for and the files lack, saying so only in
    its load report, and ends a weight of another shape in a RuntimeError after that report. Either
    would decode from random weights or end in a traceback; here both are one ValueError. Weights the
    files hold beyond the config's are left to transformers' report.

    Raises:
        ValueError: a decoder layer, embedding or output weight missing from the files (e.g. config.json
            names more layers than they hold), or a weight whose shape differs from the config's (e.g.
            another ``vocab_size``), unless the caller passes ``ignore_mismatched_sizes=True`` (it then
            sets those weights itself), naming the folder, the first such weights and how many.
    """
    allow_mismatch = bool(kwargs.pop("ignore_mismatched_sizes", False))
    with _held_load_report() as report:  # said after the checks: before a refusal it was a table of what it explains
        model, info = model_class.from_pretrained(folder, ignore_mismatched_sizes=True, output_loading_info=True,
                                                  **kwargs)
    missing = [k for k in info.get("missing_keys", ()) if any(part in k for part in _REQUIRED_WEIGHTS)]
    if missing:
        raise ValueError(f"{str(folder)!r}: config.json asks for weights its files do not hold ({len(missing)}, e.g. "
                         f"{', '.join(sorted(missing)[:2])}); transformers would start them at random. Check that "
                         f"config.json (e.g. num_hidden_layers) is the one saved with these weights")
    mismatched = [] if allow_mismatch else list(info.get("mismatched_keys", ()))
    if mismatched:
        first = mismatched[0]
        what = (f"{first[0]} is {list(first[1])} in the files, {list(first[2])} by config.json"
                if isinstance(first, (tuple, list)) and len(first) == 3 else str(first))
        raise ValueError(f"{str(folder)!r}: config.json does not fit its weights ({len(mismatched)} of another shape: "
                         f"{what}); check that config.json (e.g. vocab_size, hidden_size) is the one saved with these "
                         f"weights")
    for record in report:  # a load that is not refused reports as transformers does
        logging.getLogger(record.name).handle(record)
    return model


@contextlib.contextmanager
def _held_load_report():
    """Hold transformers' load report (a warning of ``transformers.modeling_utils``) while a checkpoint loads;
    yields the list of held records, for the caller to emit once it has not refused the load."""
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        if "LOAD REPORT" in record.getMessage():
            held.append(record)
            return False
        return True

    logger = logging.getLogger("transformers.modeling_utils")
    logger.addFilter(hold)
    try:
        yield held
    finally:
        logger.removeFilter(hold)


#: parts of a weight's name that a checkpoint cannot do without (checked by :func:`checked_from_pretrained`)
_REQUIRED_WEIGHTS = (".layers.", "embed_tokens", "lm_head")  # not the VQ model: Lumina-mGPT files lack it (a VQGAN of its own)


def complete_device_map(model: torch.nn.Module, device_map: dict, default: str) -> dict:
    """A module -> device map that places every module of ``model``: those the given map names where it says, every
    other one on ``default`` (the run's ``--device``; a ``""`` entry of the map gives another default). accelerate
    takes only a map that covers every weight (its error lists each weight left out), and ``""`` beside other
    entries leaves those weights on 'meta'.

    Raises:
        ValueError: a name that is no module or weight of the model (one line naming it and a few that are).
    """
    given = dict(device_map)
    default = given.pop("", default)
    if not given:
        return {"": default}
    modules = dict(model.named_modules())
    weights = {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}
    unknown = [name for name in given if name not in modules and name not in weights]
    if unknown:
        top = ", ".join(repr(n) for n, _ in model.named_children())
        raise ValueError(f"--device-map: {unknown[0]!r} is not a module of this model; its modules are named from "
                         f"{top} down (e.g. {decoder_layers_prefix(model) + '.0'!r})")
    placed = dict(given)

    def place(name: str, module: torch.nn.Module) -> None:
        if name in given:
            return
        if not any(key.startswith(name + ".") or not name for key in given):
            placed[name] = default
            return
        for child, sub in module.named_children():
            place(f"{name}.{child}" if name else child, sub)
        for own, _ in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            full = f"{name}.{own}" if name else own
            if full not in given:
                placed[full] = default

    place("", model)
    return placed


def _check_offload(model_class: Any, folder: str | os.PathLike, device_map: dict) -> None:
    """Refuse a map offloading to disk a module that holds the decoder layers: the adapters call the decoder's
    ``embed_tokens`` and ``layers`` themselves, past the offloaded parent's hook (its weights would stay on 'meta')."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        skeleton = model_class._from_config(config) if hasattr(model_class, "_from_config") else model_class(config)
    layers = decoder_layers_prefix(skeleton)
    decoder = layers.rpartition(".")[0]
    for name, place in device_map.items():
        if place == "disk" and (name == "" or decoder == name or decoder.startswith(name + ".") or layers == name):
            raise ValueError(f"--device-map: {name!r} -> disk offloads the language model's decoder whole; csdgen calls its "
                             f"embed_tokens and layers one by one: offload decoder layers ('{layers}.N') instead")


def _offloads(device_map: Any) -> bool:
    return isinstance(device_map, str) or isinstance(device_map, dict) and "disk" in device_map.values()


def quantize_module(module: torch.nn.Module, name: str, device: str | torch.device,
                    prefix: str | None = None) -> torch.nn.Module:
    """Quantise, in place, the linear layers of a model built in memory (torchao's ``quantize_``).

    Args:
        module: a transformers decoder (e.g. the built-in model's ``LlamaForCausalLM``), already on ``device``.
        name: ``int8``, ``int4`` or ``fp8`` (torchao; bitsandbytes quantises only while loading a checkpoint).
        prefix: the layers to quantise (default :func:`decoder_layers_prefix`); the rest keep their dtype.

    Returns:
        ``module``.

    Raises:
        ValueError: ``nf4`` / ``bnb8`` (they need a checkpoint folder), or what :func:`check_quantize` refuses.
    """
    check_in_memory_quantize(name, device)
    tq = _quiet_torchao()
    inside = (prefix or decoder_layers_prefix(module)) + "."
    tq.quantize_(module, _torchao_config(name),
                 filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear) and fqn.startswith(inside))
    return module

