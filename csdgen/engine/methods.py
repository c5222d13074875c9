"""``generate``'s method, window and sampling arguments checked and resolved: the method names
(:data:`METHODS`), a method name to its acceptance rule (with the family's defaults), the
family's default sampling settings."""

from __future__ import annotations

from typing import Any

from ..acceptance import RULES, SJD, AcceptanceRule, make_rule
from ..models.base import ImageTokenModel
from ..sampling import SamplingConfig

__all__ = ["METHODS"]

#: method names ``generate`` takes: ``"ar"`` plus every acceptance rule's name
METHODS = ("ar", "sjd", "csd", "addition", "jacobi", "gsd", "lantern")


def _check_window(window: Any, num_tokens: int | None = None) -> int | str:
    """``window`` checked (an integer >= 1 or ``"auto"``) and capped at the image length ``num_tokens``:
    no iteration can use more slots, and the loop's buffers are sized by it."""
    if isinstance(window, str) and window == "auto":
        return "auto"
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r}: must be an integer >= 1 (1 = AR) or 'auto'")
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
    if sampling is not None and not isinstance(sampling, SamplingConfig):
        raise ValueError(f"sampling={_short(sampling)}: allowed None (the model's defaults) or a csdgen.SamplingConfig, "
                         f"e.g. csdgen.SamplingConfig(guidance_scale=3.0, temperature=1.0)")


def _preset(name: str | None) -> dict:
    """The settings of preset ``name`` (:data:`csdgen.models.defaults.PRESETS`), ``{}`` for None."""
    from ..models.defaults import PRESETS

    if name is None:
        return {}
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"preset={name!r}: allowed None or {', '.join(map(repr, PRESETS))}")
    return PRESETS[name]


def _resolve_method(method: str | AcceptanceRule, model: ImageTokenModel,
                    preset: dict | None = None) -> tuple[AcceptanceRule, str]:
    if isinstance(method, type) and issubclass(method, AcceptanceRule):
        raise ValueError(f"method={method.__name__} is the rule's class; allowed: an instance such as "
                         f"{method.__name__}() (the rule's default options) or a method name ({', '.join(METHODS)})")
    if not isinstance(method, (str, AcceptanceRule)):
        raise ValueError(f"method={_short(method)}: allowed a method name ({', '.join(METHODS)}) or an AcceptanceRule "
                         f"instance such as csdgen.CSD(lam=0.5)")
    if isinstance(method, str) and method == "ar":
        return SJD(), "ar"
    if isinstance(method, str) and method not in METHODS:
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(METHODS)} (or an AcceptanceRule)")
    if isinstance(method, AcceptanceRule):
        return method, method.name
    options = {}
    if method == "csd" and preset and "lam" in preset:
        options = {"lam": preset["lam"], "delta": preset["delta"]}
    elif method == "csd" and model.defaults is not None:
        options = {"lam": model.defaults.lam, "delta": model.defaults.delta}
    needs_codebook = getattr(RULES[method], "needs_codebook", False)
    rule = make_rule(method, codebook=model.codebook_embeddings() if needs_codebook else None, **options)
    return rule, rule.name


def _default_sampling(model: ImageTokenModel) -> SamplingConfig:
    d = model.defaults
    if d is None:
        return SamplingConfig()
    # a family's top-k at or above this checkpoint's codebook size keeps every token (tiny test checkpoints)
    top_k = d.top_k if d.top_k is not None and d.top_k < model.codebook_size else None
    return SamplingConfig(guidance_scale=d.guidance_scale, temperature=d.temperature, top_k=top_k,
                          top_p=getattr(d, "top_p", None), guidance_schedule=getattr(model, "reference_guidance", None))
