"""The built-in model as an image-token model: class-conditional Llama + VQ tokenizer + classifier.

Shipped inside the package (``csdgen/builtin/weights``, trained by
``python -m csdgen.builtin.train``), so csdgen generates images on a fresh machine with no
download. 64 x 64 RGB images, 16 x 16 = 256 tokens, codebook of 1024, the classes its config.json
lists (94 Noto emoji in the shipped weights), named by their Unicode names in lower case ("red apple",
"dog face"; aliases: the emoji's short names, "apple"), see ``csdgen/builtin/README.md``.
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch

from ..class_names import ClassNames
from ..tensor_checks import is_integer_tensor
from .defaults import FAMILY_DEFAULTS
from .llama import ClassConditionalLlama

__all__ = ["BUILTIN_DTYPES", "BuiltinModel", "cpu_bfloat16_attention", "load_builtin_model"]


class BuiltinModel(ClassConditionalLlama):
    """:class:`ClassConditionalLlama` with the built-in VQ decoder and emoji classifier attached.

    Attributes:
        components: the loaded :class:`csdgen.builtin.BuiltinComponents` (vq, ar, classifier, config).
        defaults: ``FAMILY_DEFAULTS["builtin"]``, the measured defaults (benchmarks/results/builtin_1911_classes.md) that
            :func:`csdgen.generate` uses for every argument left None.
        save_scale: the nearest-neighbour upscaling its PNGs are saved at (2: 128 x 128 pixels),
            by ``csdgen generate`` and by :func:`csdgen.save_run` unless told otherwise.
    """

    defaults = FAMILY_DEFAULTS["builtin"]
    save_scale = 2

    def __init__(self, components):
        config = components.config
        try:
            super().__init__(components.ar, config["codebook_size"], config["num_classes"], tuple(config["grid"]),
                             class_names=config["class_names"], class_categories=config.get("class_categories"),
                             class_aliases=config.get("class_short_names"))
        except ValueError as exc:
            if "same name" not in str(exc):
                raise
            raise ValueError(f"{exc} in {components.weights_dir}/config.json; for emoji weights: "
                             f"python -m csdgen.builtin.emoji --update-config {components.weights_dir}") from None
        self.components = components
        # the emoji's own characters and the emoji it knows of without drawing them (config.json)
        self.classes = ClassNames.from_config(config)
        #: the classes ``csdgen generate`` draws when no ``--class`` is given (config ``default_classes``),
        #: as indices; ``None``: every class in turn
        self.default_classes = (self.classes.resolve(config["default_classes"])
                                if config.get("default_classes") else None)
        #: what ``window="auto"`` starts from in a fresh process: acceptance counts per ``"rule/refresh"``
        #: recorded on these weights (config ``auto_window_prior``; :func:`csdgen.engine.window.prior_counts`)
        self.auto_window_prior = {k: v for k, v in (config.get("auto_window_prior") or {}).items() if k != "how"}
        #: (its ``"times"``: seconds per iteration by batch size and width, csdgen.engine.window.prior_times)

    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens ``[B, N]`` int64 -> images ``[B, 3, 64, 64]`` float32 in [-1, 1].

        Raises:
            ValueError: ``tokens`` not ``[B, N]`` integers in ``0 .. V-1`` (naming the shape and range).
        """
        N, V = self.num_image_tokens, self.codebook_size
        allowed = f"allowed: tokens [B, {N}] int64 in 0..{V - 1}"
        if not is_integer_tensor(tokens) or tokens.dim() != 2 or tokens.shape[1] != N:
            what = f"shape {list(tokens.shape)} {tokens.dtype}" if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(f"decode_images: tokens of {what}; {allowed}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= V):
            raise ValueError(f"decode_images: tokens in {int(tokens.min())}..{int(tokens.max())}; {allowed}")
        with torch.no_grad():
            return self.components.vq.decode(tokens.reshape(-1, *self.grid).to(self.device))

    def codebook_embeddings(self) -> torch.Tensor:
        """``[V, D]`` float32 codebook vectors of the VQ tokenizer."""
        return self.components.vq.embeddings.detach()


#: the dtypes the built-in model's AR transformer runs in (its VQ decoder and classifier stay float32)
BUILTIN_DTYPES = ("float32", "bfloat16")


@lru_cache(maxsize=4)
def _load(weights_dir: str | None, device: str | None = None, dtype: str = "float32") -> BuiltinModel:
    """The model of ``weights_dir`` on ``device`` (None: the CPU it loads onto) in ``dtype``, one per process
    and triple: a model moved to another device or dtype is another object, so the float32 CPU model others
    hold stays as it is."""
    from csdgen.builtin import load_components

    model = BuiltinModel(load_components(weights_dir))
    if device is not None:
        _move(model, device)
    if dtype != "float32":
        _cast(model, getattr(torch, dtype))
    return model


def _cast(model: BuiltinModel, dtype: torch.dtype) -> None:
    """The AR transformer in ``dtype``; on a CPU, its attention :func:`cpu_bfloat16_attention`."""
    model.components.ar.to(dtype)
    if model.device.type == "cpu":
        model.components.ar.set_attn_implementation(cpu_bfloat16_attention())


def cpu_bfloat16_attention(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The transformers attention the built-in model runs in bfloat16 on this CPU: ``"sdpa"`` (torch's
    ``scaled_dot_product_attention``) where the CPU has AMX bfloat16 tiles (the ``amx_bf16`` flag of
    ``cpuinfo``), else ``"eager"`` (two matmuls and a float32 softmax); ``"eager"`` where ``cpuinfo``
    cannot be read (not Linux).

    Which one is faster depends on the CPU, not on the shapes (benchmarks/results/builtin_bfloat16.md,
    2 threads, torch 2.13, 8 heads of 32, one query, 320 columns): on an AMD EPYC with ``avx512_bf16``
    and no AMX, torch's kernel took 108 us against the matmuls' 77 at 2 rows and 1227 against 327 at 24;
    on an Intel Xeon with AMX, 41 us against 149 at 2 rows and 447 against 758 at 24, and a
    bfloat16 forward of the model with ``sdpa`` took 0.59-0.99x the ``eager`` one at 1-16 images. A rule on the
    CPU's flags, not a timing at load: a timing could choose differently from one process to the next,
    and the two round differently in bfloat16, so the same seed could draw another image.
    """
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags") and "amx_bf16" in line.split(":", 1)[-1].split():
                    return "sdpa"
                if line.startswith("flags"):
                    return "eager"  # the first processor's flags: every core of one machine has the same
    except OSError:
        pass
    return "eager"


def _move(model: BuiltinModel, device) -> None:
    for module in (model.components.ar, model.components.vq, model.components.classifier):
        module.to(device)
    model.device = torch.device(device)


def load_builtin_model(weights_dir: str | os.PathLike | None = None, *, quantize: str | None = None,
                       device: str | torch.device | None = None,
                       dtype: str | torch.dtype | None = None) -> BuiltinModel:
    """Load the built-in model offline (cached per process, one per weights folder, device and dtype,
    unless ``quantize`` is given).

    Args:
        weights_dir: folder holding ``config.json`` and the ``*.safetensors`` files; default:
            the weights shipped in the package.
        quantize: None, or ``int8`` (``int4`` / ``fp8`` where the device runs them): a fresh copy whose
            AR model's decoder layers are quantised by torchao (:func:`csdgen.models.quantize.quantize_module`);
            the VQ decoder and classifier stay float32.
        device: where the model goes (default: where it was loaded, the CPU).
        dtype: what its AR transformer computes in, a name of :data:`BUILTIN_DTYPES` or its torch dtype
            (None or ``"auto"``: float32, the dtype it was trained and measured in). ``bfloat16`` draws from
            float32's distribution within bfloat16's rounding (tests/test_builtin_bfloat16.py) and runs
            faster where the processor has bfloat16 instructions (benchmarks/results/builtin_bfloat16.md);
            the VQ decoder and the classifier stay float32.

    Raises:
        FileNotFoundError: if the weights are not there.
        ValueError: an empty path (``""``: ``Path("")`` would be the current folder); a ``quantize`` the
            device or the installed packages cannot run; a ``device`` torch does not know, or CUDA
            where none is visible; a ``dtype`` not in :data:`BUILTIN_DTYPES`, or ``quantize`` with a
            dtype other than float32 (one line each).
    """
    dtype_name = _dtype_name(dtype)
    if quantize is not None and dtype_name != "float32":
        raise ValueError(f"quantize={quantize!r} with dtype={dtype_name!r}: the built-in model is quantised from "
                         f"float32; allowed: one of the two")
    if isinstance(weights_dir, str) and not weights_dir.strip():
        raise ValueError(f"weights_dir={weights_dir!r}: an empty path; allowed: a folder of the built-in model's "
                         f"weights, or None for the shipped ones")
    if device is not None:  # torch's RuntimeError listed 20 device types; CUDA's absence was an AssertionError
        from .dtypes import check_device

        check_device(device)
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={device!r}: no CUDA device is visible here; allowed: 'cpu' (or None)")
    key = None if weights_dir is None else str(weights_dir)
    if quantize is None:
        # moving the cached CPU model moved it for every other caller: load_builtin_model() after a
        # load_builtin_model(device="cuda") was on CUDA
        model = _load(key, None if device is None or torch.device(device) == torch.device("cpu") else str(device),
                      dtype_name)
    else:
        from csdgen.builtin import load_components

        from .quantize import check_in_memory_quantize, quantize_module

        check_in_memory_quantize(quantize, device or "cpu")  # before the weights are read
        model = BuiltinModel(load_components(key))
    if device is not None and torch.device(device) != torch.device(model.device):
        _move(model, device)
    if quantize is not None:
        quantize_module(model.backbone, quantize, model.device)
    model.quantize = quantize
    return model


def _dtype_name(dtype) -> str:
    """``dtype`` (None, ``"auto"``, a name of :data:`BUILTIN_DTYPES` or its torch dtype) as a name of
    :data:`BUILTIN_DTYPES`; anything else: ValueError naming it and the allowed ones."""
    if dtype is None or dtype == "auto":
        return "float32"
    name = str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else dtype
    if name not in BUILTIN_DTYPES:
        raise ValueError(f"dtype={dtype!r}: the built-in model runs in {' or '.join(BUILTIN_DTYPES)}; "
                         f"allowed: {', '.join(('auto',) + BUILTIN_DTYPES)}")
    return name
