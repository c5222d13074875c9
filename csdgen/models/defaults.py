"""Published decoding defaults per model family, with their sources.

``None`` for top-k / top-p means none. Where no value is published the entry says so in
``notes`` and csdgen falls back to the CSD reference values (lambda 0.5, delta 0.65, window 16).
The same table is in ``docs/models.md`` (:func:`family_defaults_table` writes it; a test compares the two).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FamilyDefaults", "FAMILY_DEFAULTS", "family_defaults", "METHOD_DRAFT_INIT", "METHOD_REFRESH", "PRESETS",
           "method_refresh", "family_defaults_table"]


@dataclass(frozen=True)
class FamilyDefaults:
    """Decoding defaults of one family: ``guidance_scale``, ``temperature``, ``top_k`` / ``top_p`` (None: off),
    CSD's ``lam`` and ``delta``, and ``window``, the fixed Jacobi width of ``csdgen compare`` and ``csdgen bench``
    when ``--window`` is left out (:func:`csdgen.generate` and ``csdgen generate`` default to ``"auto"``);
    ``sources`` and ``notes`` say where each value comes from."""

    guidance_scale: float
    temperature: float
    top_k: int | None
    window: int
    lam: float
    delta: float
    sources: str
    notes: str = ""
    top_p: float | None = None


FAMILY_DEFAULTS: dict[str, FamilyDefaults] = {
    "janus": FamilyDefaults(
        5.0, 1.0, None, 16, 0.5, 0.65,
        sources="CSD public code (Janus-Pro-7B): CFG 5, T 1, no top-k, window 16, lambda 0.5, delta 0.65",
    ),
    "lumina-mgpt": FamilyDefaults(
        3.0, 1.0, 2000, 16, 0.5, 0.65,
        sources="SJD code / Lumina-mGPT 768 px: CFG 3.0, image top-k 2000, T 1.0, window 16",
        notes="CSD's lambda and delta for Lumina-mGPT are not published (no public code): CSD reference values used",
    ),
    "lumina-mgpt-2": FamilyDefaults(
        4.0, 1.0, 4096, 16, 0.5, 0.65,
        sources="Lumina-mGPT 2.0 README / scripts/sample.sh: CFG 4.0, top-k 4096, T 1.0, 768 px; "
                "its SJD window 16 (generate.py max_num_new_tokens)",
        notes="guidance follows the reference's schedule max(4, g (1 - n / D)) per token (Lumina2Guidance; "
              "constant 4 at CFG 4); CSD's lambda and delta not published: CSD reference values used",
    ),
    "emu3": FamilyDefaults(
        3.0, 1.0, 2048, 16, 0.5, 0.65,
        sources="SJD code (Emu3): CFG 3.0, top-k 2048, window 16",
        notes="temperature, lambda and delta not published for Emu3: T 1 and the CSD reference values used",
    ),
    "anole": FamilyDefaults(
        3.0, 0.7, None, 16, 0.5, 0.65,
        sources="Anole/Chameleon image sampling (GAIR-NLP/anole chameleon/inference/chameleon.py Options.Image): "
                "T 0.7, top-p 0.9, text guidance 3.0",
        notes="window, lambda and delta not published for Anole: CSD reference values used",
        top_p=0.9,
    ),
    "glm-image": FamilyDefaults(
        1.0, 0.9, None, 16, 0.5, 0.65,
        sources="zai-org/GLM-Image README (AR prior: do_sample, T 0.9, top-p 0.75) and its generation_config.json as "
                "vLLM-Omni's GLM-Image examples quote it (top-k = vision_vocab_size 16512: none); diffusers "
                "GlmImagePipeline.generate_prior_tokens samples the prior without guidance",
        notes="no CFG in the AR stage (guided sessions are refused); window, lambda and delta not published for "
              "GLM-Image: CSD reference values used",
        top_p=0.75,
    ),
    "liquid": FamilyDefaults(
        7.0, 0.99, 4096, 16, 0.5, 0.65,
        sources="FoundationVision/Liquid evaluation/inference_t2i.py defaults: CFG 7, top-k 4096, top-p 0.96, T 0.99",
        notes="window, lambda and delta not published for Liquid: CSD reference values used",
        top_p=0.96,
    ),
    "builtin": FamilyDefaults(
        3.0, 1.0, None, 32, 0.5, 0.65,
        sources="measured on the built-in model's earlier (1,911-class) weights, 64 images per setting (benchmarks/results/builtin_1911_classes.md)",
    ),
}


def family_defaults(family: str) -> FamilyDefaults:
    """Defaults of ``family``.

    Raises:
        ValueError: unknown family (listing the known ones).
    """
    if family not in FAMILY_DEFAULTS:
        raise ValueError(f"unknown model family {family!r}; allowed: {', '.join(FAMILY_DEFAULTS)}")
    return FAMILY_DEFAULTS[family]


#: Each method's default refresh of the pending drafts after a rejection (``generate(refresh=None)``,
#: ``csdgen generate`` without ``--refresh``). Both modes are lossless for a lossless rule, so for
#: SJD the one with the higher step compression wins: coupled (built-in model, window 32, batch 1:
#: 5.16x against 2.86x; docs/frontier.md). For CSD coupled too: on the built-in model it committed
#: more tokens per forward (3.87x against 2.81x, window 32, batch 16) with a lower Frechet distance
#: and NLL, class consistency 0.027 lower (benchmarks/results/builtin_1911_classes.md, "Default refresh"). The other rules keep the
#: independent refresh of their references (not measured against coupled; AR has no drafts).
METHOD_REFRESH: dict[str, str] = {
    "ar": "independent",
    "sjd": "coupled",
    "csd": "coupled",
    "addition": "independent",
    "jacobi": "independent",
    "gsd": "independent",
    "lantern": "independent",
}

#: Named sets of settings, one option away (``generate(preset=...)``, ``--preset``); given
#: arguments win over a preset's. ``"paper"``: the CSD paper's settings as its public code runs
#: them: independent refresh (SJD's), uniform draft initialisation, window 16, lambda 0.5 and
#: delta 0.65 (the CSD reference values; /work/shared/docs/algorithms.md, "CSD").
PRESETS: dict[str, dict] = {
    "paper": {"refresh": "independent", "draft_init": "uniform", "window": 16, "lam": 0.5, "delta": 0.65},
}


#: The draft initialisation a method's rule needs (its ``AcceptanceRule.draft_init``; absent: any), written
#: here so that the command line knows it without importing torch (a test checks it against the rules).
#: A preset's ``draft_init`` is not applied to these methods: ``--preset paper --method gsd`` runs
#: GSD with one-hot drafts, as ``generate(preset="paper", method="gsd")`` does.
METHOD_DRAFT_INIT: dict[str, str] = {
    "gsd": "onehot",
    "lantern": "onehot",
}


def method_refresh(method: str) -> str:
    """The default refresh of ``method`` (a method name, :data:`METHOD_REFRESH`; unknown: ``"independent"``)."""
    return METHOD_REFRESH.get(method, "independent")


def family_defaults_table() -> str:
    """The Markdown table of :data:`FAMILY_DEFAULTS` that docs/models.md holds.

    A test checks that docs/models.md contains exactly this text, so the two cannot drift.
    """
    lines = ["| family | guidance scale | temperature | top-k | top-p | window | lambda | delta | sources | notes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, d in FAMILY_DEFAULTS.items():
        top_k = "none" if d.top_k is None else str(d.top_k)
        top_p = "none" if d.top_p is None else f"{d.top_p:g}"
        cells = [f"`{name}`", f"{d.guidance_scale:g}", f"{d.temperature:g}", top_k, top_p, str(d.window), f"{d.lam:g}",
                 f"{d.delta:g}", d.sources, d.notes or "-"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
