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


def _check_window(window: Any) -> int | str:
    if window == "auto":
        return "auto"
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r}: must be an integer >= 1 (1 = AR) or 'auto'")
    return window


def _resolve_method(method: str | AcceptanceRule, model: ImageTokenModel) -> tuple[AcceptanceRule, str]:
    if isinstance(method, str) and method == "ar":
        return SJD(), "ar"
    if isinstance(method, str) and method not in METHODS:
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(METHODS)} (or an AcceptanceRule)")
    if isinstance(method, AcceptanceRule):
        return method, method.name
    options = {}
    if method == "csd" and model.defaults is not None:
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
                          top_p=getattr(d, "top_p", None))
