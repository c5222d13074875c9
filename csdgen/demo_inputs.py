"""The demo page's inputs: each field checked and read into :class:`DemoSettings`.

A bad field is one line naming the value and what is allowed (shown on the page); the seed field
reads exact integers as ``--seed`` does; the window is a width or ``auto`` where the engine has it.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

import csdgen
from csdgen.evaluation.compare import method_presets
from csdgen.sampling import MAX_SEED, SamplingConfig, check_seed


#: methods the page offers (keys of :func:`csdgen.evaluation.compare.method_presets`) and their labels
METHOD_LABELS = {
    "ar": "AR", "sjd": "SJD", "sjd-coupled": "coupled SJD", "jacobi": "Jacobi", "addition": "Addition",
    "gsd": "GSD", "lantern": "LANTERN", "csd": "CSD", "csd-coupled": "coupled CSD",
}


DEFAULT_METHODS = ["ar", "csd"]


@dataclass
class DemoSettings:
    """One validated request of the page."""

    condition: Any  #: class id (built-in model) or prompt string
    label: str  #: the prompt as typed, or the class's name (``random``: the class drawn)
    methods: list[str]
    window: int | str
    lam: float
    delta: float
    guidance_scale: float
    seed: int


def window_auto_supported() -> bool:
    """Whether this csdgen's :func:`csdgen.generate` takes ``window="auto"`` (the engine's own window choice)."""
    parameter = inspect.signature(csdgen.generate).parameters["window"]
    return parameter.default in (None, "auto") or "auto" in str(parameter.annotation) or "str" in str(parameter.annotation)


def _number(name: str, value: Any, allowed: str) -> float:
    if value is None:  # what a page's number field sends when it holds no number (empty, or 1e400)
        raise ValueError(f"{name}: the field holds no number; allowed: {allowed}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r}: must be a number; allowed: {allowed}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name}={value!r}: must be a finite number; allowed: {allowed}")
    return number


def parse_inputs(model, condition: Any, methods: list[str] | None, window: Any, lam: Any, delta: Any,
                 guidance_scale: Any, seed: Any) -> DemoSettings:
    """Check the page's inputs; every error is one line naming the bad value and what is allowed.

    Args:
        model: the page's model; a model with ``class_ids`` takes a class name (any case and spacing, a
            short name), an index or ``random`` (a class drawn from the seed), any other a prompt.
        window: an integer in 1 .. the image's tokens (ASCII digits, or an integral number), or ``"auto"``
            where :func:`window_auto_supported`.

    Raises:
        ValueError: empty condition, unknown class (with close matches), no or unknown methods, bad
            window, lambda, delta, guidance scale or seed.
    """
    text = str(condition if condition is not None else "").strip()
    if not text:
        raise ValueError("the class or prompt is empty; " + _condition_help(model))
    if methods is not None and not isinstance(methods, (list, tuple)):
        raise ValueError(f"methods={_clip(methods)}: allowed a list of method names ({', '.join(METHOD_LABELS)})")
    methods = list(methods or [])
    if not methods:
        raise ValueError(f"no method chosen; tick one or more of {', '.join(METHOD_LABELS.values())}")
    unknown = [m for m in methods if not isinstance(m, str) or m not in METHOD_LABELS]
    if unknown:
        raise ValueError(f"unknown methods {_clip(unknown)}; allowed: {', '.join(METHOD_LABELS)}")
    methods = [m for m in METHOD_LABELS if m in methods]  # the page's order (not the order they were ticked), once each
    if ("gsd" in methods or "lantern" in methods) and model.codebook_embeddings() is None:
        raise ValueError("GSD and LANTERN need the model's codebook, which this model does not expose; choose other methods")
    window_text = str(window).strip().lower()
    if window_text == "auto":
        if not window_auto_supported():
            raise ValueError("window='auto': this csdgen's engine has no automatic window; allowed: an integer >= 1")
        parsed_window: int | str = "auto"
    else:
        # as --window reads it: the text field's ASCII digits (no exponent: "1e3" is refused); from an API
        # client also an integral float; at most the image's tokens (a wider window has nothing to draft)
        if isinstance(window, float):
            parsed_window = int(window) if math.isfinite(window) and window.is_integer() else -1
        else:
            parsed_window = int(window_text) if window_text.isascii() and window_text.isdigit() else -1
        N = model.num_image_tokens
        if not 1 <= parsed_window <= N:
            raise ValueError(f"window={_clip(window)}: allowed: an integer >= 1 (1 = AR) and at most the image's "
                             f"{N} tokens" + (", or auto" if window_auto_supported() else ""))
    # named by the page's labels (the library's own checks below name its arguments: lam=, guidance_scale=)
    lam_value = _number("lambda (CSD)", lam, "a number >= 0")
    delta_value = _number("delta (CSD)", delta, "a number in [0, 1]")
    guidance = _number("guidance scale", guidance_scale, "a number >= 0 (0 = no guidance)")
    for label, number, ok, allowed in (("lambda (CSD)", lam_value, lam_value >= 0, "a number >= 0"),
                                       ("delta (CSD)", delta_value, 0 <= delta_value <= 1, "a number in [0, 1]"),
                                       ("guidance scale", guidance, guidance >= 0, "a number >= 0 (0 = no guidance)")):
        if not ok:
            raise ValueError(f"{label}={number:g}: allowed {allowed}")
    seed_value = _seed(seed)
    method_presets(lam_value, delta_value)  # CSD checks lambda and delta (one-line ValueError)
    SamplingConfig(guidance_scale=guidance)  # checks the guidance scale
    resolved: Any = text
    if getattr(model, "classes", None) is not None:
        resolved = model.classes.assign([text], 1, seed=seed_value)[0]
        text = model.class_names[resolved]
    elif hasattr(model, "class_ids"):
        resolved = model.class_ids([text])[0]
    return DemoSettings(resolved, text, methods, parsed_window, lam_value, delta_value, guidance, seed_value)


def _seed(value: Any) -> int:
    """The page's seed as an exact integer in ``0 .. MAX_SEED``: the text field's ASCII digits, as
    ``--seed`` reads them (no exponent, sign or fraction); from an API client also a float where it
    is exact (an integral value below 2**53)."""
    allowed = f"allowed: an integer in 0..{MAX_SEED}"
    if isinstance(value, str):
        text = value.strip()
        if not (text.isascii() and text.isdigit()):
            raise ValueError(f"seed={_clip(value)}: {allowed}")
        value = int(text)
    elif isinstance(value, float):
        number = _number("seed", value, allowed)
        if not number.is_integer() or abs(number) >= 2**53:
            raise ValueError(f"seed={_clip(value)}: {allowed}")
        value = int(number)
    try:
        return check_seed(value)
    except ValueError:
        raise ValueError(f"seed={_clip(value)}: {allowed}") from None


def _clip(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (a client can send anything)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _condition_help(model) -> str:
    names = getattr(model, "class_names", None)
    if hasattr(model, "class_ids"):
        if names:
            return f"allowed: one of the {len(names)} class names (e.g. {names[0]!r}), an index 0..{len(names) - 1} or random"
        return f"allowed: a class index 0..{model.num_classes - 1}"
    return "allowed: a text prompt"


def _class_hint(names: list[str]) -> str:
    """The class box's help line: how many classes, examples, what else it takes (not all 1,911 names)."""
    examples = [n for n in ("red apple", "dog face", "rocket", "grinning face") if n in names] or names[:4]
    shown = ", ".join(examples)
    return (f"one of {len(names):,} class names in any case (e.g. {shown}), a short name, an index or random; "
            f"an unknown name gets close matches. All of them: csdgen generate --list-classes")
