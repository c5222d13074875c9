"""``generate``'s method, window and sampling arguments checked and resolved: the method names
(:data:`METHODS`), a method name to its acceptance rule (with the family's defaults), the
family's default sampling settings."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from ..acceptance import RULES, SJD, AcceptanceRule, make_rule
from ..models.base import ImageTokenModel
from ..sampling import SamplingConfig, UnguidedSamplingWarning

__all__ = ["METHODS"]

#: method names ``generate`` takes: ``"ar"`` plus every acceptance rule's name
METHODS = ("ar", "sjd", "csd", "addition", "jacobi", "gsd", "lantern")


def _check_window(window: Any, num_tokens: int | None = None) -> int | str:
    """``window`` checked (an integer >= 1 or ``"auto"``) and capped at the image length ``num_tokens``:
    no iteration can use more slots, and the loop's buffers are sized by it."""
    if isinstance(window, str) and window.lower() == "auto":  # any case, as the CLI's --window takes it
        return "auto"
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
        raise ValueError(f"window={window!r}: must be an integer >= 1 (1 = AR) or 'auto'")
    window = int(window)  # numpy's integers too (np.int64(8) from an array of widths)
    if num_tokens is not None:
        window = min(window, max(num_tokens, 1))
    return window


def _check_model(model: Any) -> None:
    """A one-line error for an object that is not an image-token model (a path, a transformers model, None)."""
    if isinstance(model, ImageTokenModel):
        return
    missing = [a for a in ("start", "num_image_tokens", "codebook_size", "grid", "device") if not hasattr(model, a)]
    if missing:
        raise ValueError(f"model={_short(model)}: not an image-token model (no {', '.join(missing)}); allowed: a "
                         f"csdgen.models.ImageTokenModel, e.g. csdgen.models.load_model(path) or "
                         f"csdgen.models.builtin.load_builtin_model()")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"<{type(value).__module__}.{type(value).__qualname__} object>"


def _check_sampling(sampling: Any) -> None:
    if sampling is not None and not isinstance(sampling, (SamplingConfig, Mapping)):
        raise ValueError(f"sampling={_short(sampling)}: allowed None (the model's defaults), a dict of changes to the "
                         f"model's defaults such as {{'temperature': 0.5}}, or a csdgen.SamplingConfig (exactly these "
                         f"settings), e.g. csdgen.SamplingConfig(guidance_scale=3.0, temperature=1.0)")


def _resolve_sampling(model: ImageTokenModel, sampling: Any) -> SamplingConfig:
    """``generate``'s ``sampling`` as a :class:`SamplingConfig`: None -> the model's defaults; a mapping ->
    the model's defaults with those fields changed (unknown keys refused); a SamplingConfig -> itself,
    with an :class:`UnguidedSamplingWarning` when it runs unguided (guidance_scale 1.0, SamplingConfig's own
    default) while the model's default guidance is above 1.

    Raises:
        ValueError: another type, an unknown key (naming it and the allowed ones), or a value
            SamplingConfig refuses.
    """
    _check_sampling(sampling)
    default = default_sampling(model)
    if sampling is None:
        return _unguided_at_most_1(model, default)
    if isinstance(sampling, SamplingConfig):
        if not sampling.guided and default.guidance_scale > 1:
            _warn_unguided(sampling, default.guidance_scale)
        return _unguided_at_most_1(model, sampling)
    allowed = [f.name for f in fields(SamplingConfig)]
    unknown = [key for key in sampling if key not in allowed]
    if unknown:
        import difflib

        named = ", ".join(repr(key) + "".join(f" (did you mean {close[0]!r}?)" for close in
                                              [difflib.get_close_matches(str(key), allowed, n=1)] if close)
                          for key in unknown)
        raise ValueError(f"sampling={_short(dict(sampling))}: unknown key{'s' if len(unknown) > 1 else ''} {named}; "
                         f"allowed keys: {', '.join(allowed)} (changes to the model's defaults)")
    return _unguided_at_most_1(model, replace(default, **sampling))  # SamplingConfig checks the values


def _unguided_at_most_1(model: ImageTokenModel, sampling: SamplingConfig) -> SamplingConfig:
    """A model whose reference guides only above scale 1 (``model.guides_above_1_only``, Liquid) runs a
    scale below 1 unguided, as its reference does: the scale becomes 1.0 (no unconditional rows)."""
    if getattr(model, "guides_above_1_only", False) and sampling.guidance_scale < 1.0:
        return replace(sampling, guidance_scale=1.0)
    return sampling


def _warn_unguided(sampling: SamplingConfig, model_scale: float) -> None:
    """One line: this SamplingConfig runs unguided, the model's default is guided; both ways to keep its guidance."""
    import sys
    import warnings
    from pathlib import Path

    changed = {f.name: getattr(sampling, f.name) for f in fields(sampling) if getattr(sampling, f.name) != f.default}
    given = ", ".join(f"{k}={v!r}" for k, v in changed.items())
    keep = f"sampling={changed!r} (a dict: changes to the model's defaults)" if changed else "sampling=None"
    unguided = {"guidance_scale": 1.0, **changed}
    package = str(Path(__file__).resolve().parents[1])
    level, frame = 1, sys._getframe(0)
    while frame is not None and frame.f_code.co_filename.startswith(package):  # point at the caller's own line
        if frame.f_code.co_filename.startswith((str(Path(package, "demo")), str(Path(package, "serve")))):  # demo*.py
            return  # the demo's and the server's guidance comes from their user, explicitly
        frame, level = frame.f_back, level + 1
    warnings.warn(f"sampling=SamplingConfig({given}) runs unguided (guidance_scale 1.0, SamplingConfig's default), "
                  f"not with the model's guidance_scale {model_scale:g}: to keep it give {keep} or "
                  f"SamplingConfig(guidance_scale={model_scale:g}{', ' + given if given else ''}); "
                  f"sampling={unguided!r} runs unguided without this warning", UnguidedSamplingWarning, stacklevel=level)


def _preset(name: str | None) -> dict:
    """The settings of preset ``name`` (:data:`csdgen.models.defaults.PRESETS`), ``{}`` for None."""
    from ..models.defaults import PRESETS

    if name is None:
        return {}
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"preset={name!r}: allowed None or {', '.join(map(repr, PRESETS))}")
    return PRESETS[name]


def resolve_method(method: str | AcceptanceRule, model: ImageTokenModel,
                   preset: dict | None = None) -> tuple[AcceptanceRule, str]:
    """``(rule, method name)`` of a method name (any case; ``"ar"``: SJD at window 1) or an
    :class:`AcceptanceRule` instance; CSD takes ``lam``/``delta`` from ``preset``, else the model's
    defaults. Raises ``ValueError`` naming the bad method and the allowed names."""
    if isinstance(method, type) and issubclass(method, AcceptanceRule):
        raise ValueError(f"method={method.__name__} is the rule's class; allowed: an instance such as "
                         f"{method.__name__}() (the rule's default options) or a method name ({', '.join(METHODS)})")
    if not isinstance(method, (str, AcceptanceRule)):
        raise ValueError(f"method={_short(method)}: allowed a method name ({', '.join(METHODS)}) or an AcceptanceRule "
                         f"instance such as csdgen.CSD(lam=0.5)")
    if isinstance(method, str) and method.lower() in METHODS:
        method = method.lower()  # "CSD" as the paper spells it
    if isinstance(method, str) and method == "ar":
        return SJD(), "ar"
    if isinstance(method, str) and method not in METHODS:
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(METHODS)} (or an AcceptanceRule)")
    if isinstance(method, AcceptanceRule):
        name = getattr(method, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"method={_short(method)}: an AcceptanceRule sets its name (a class attribute, e.g. "
                             f"name = 'myrule'), which records and tables show; this one has none")
        size = getattr(method, "codebook_size", None)
        if size is not None and size != model.codebook_size:  # else an IndexError deep in the rule
            raise ValueError(f"method={_short(method)}: made with a codebook of {size} entries, the model's has "
                             f"{model.codebook_size}; allowed: a rule made with this model's codebook, e.g. "
                             f"csdgen.make_rule({name!r}, codebook=model.codebook_embeddings()), or the name {name!r}")
        return method, name
    options = {}
    if method == "csd" and preset and "lam" in preset:
        options = {"lam": preset["lam"], "delta": preset["delta"]}
    elif method == "csd" and model.defaults is not None:
        options = {"lam": model.defaults.lam, "delta": model.defaults.delta}
    needs_codebook = getattr(RULES[method], "needs_codebook", False)
    codebook = model.codebook_embeddings() if needs_codebook else None
    if needs_codebook and codebook is None:
        raise ValueError(f"the {method} rule needs the model's codebook embeddings [V, D]; this model provides none "
                         f"(its codebook_embeddings() returned None)")
    rule = make_rule(method, codebook=codebook, **options)
    return rule, rule.name


def default_sampling(model: ImageTokenModel) -> SamplingConfig:
    """The model's default :class:`SamplingConfig` (its family's guidance, temperature, top-k/top-p;
    a top-k at or above the codebook size dropped); ``SamplingConfig()`` for a model without defaults."""
    d = model.defaults
    if d is None:
        return SamplingConfig()
    # a family's top-k at or above this checkpoint's codebook size keeps every token (tiny test checkpoints)
    top_k = d.top_k if d.top_k is not None and d.top_k < model.codebook_size else None
    return SamplingConfig(guidance_scale=d.guidance_scale, temperature=d.temperature, top_k=top_k,
                          top_p=getattr(d, "top_p", None), guidance_schedule=getattr(model, "reference_guidance", None))
