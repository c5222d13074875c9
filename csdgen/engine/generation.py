"""The engine's public entry point, :func:`generate`: arguments checked and resolved, then one
run of the loop (or of the tree loop)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

from ..acceptance import AcceptanceRule
from ..drafting import check_drafting, resolve_draft_init
from ..models._static import ENGINES
from ..models.base import ImageTokenModel
from ..models.defaults import method_refresh
from ..sampling import SamplingConfig, check_seed
from ..trees import check_tree
from .loop import _Loop, checked_image_indices
from .methods import _check_model, _check_sampling, _check_window, _preset, resolve_method, _resolve_sampling
from .results import GenerationResult, StepInfo
from .tree_loop import _TreeLoop

__all__ = ["generate", "resolve_arguments", "check_conditions", "check_engine"]


def check_engine(engine, compile) -> None:
    """Refuse an ``engine`` not in :data:`ENGINES` or a ``compile`` other than True, False or None
    (``ValueError`` naming the value and what is allowed)."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}: allowed {', '.join(map(repr, ENGINES))}")
    if compile is not None and not isinstance(compile, bool):
        raise ValueError(f"compile={compile!r}: allowed True, False or None (on CUDA only)")


def check_top_k(model: ImageTokenModel, top_k: int | None) -> None:
    """Refuse a top-k above the model's codebook size (None: no top-k).

    Raises:
        ValueError: ``top_k=2048 exceeds the codebook size V=48; allowed: 1..48``.
    """
    if top_k is not None and top_k > model.codebook_size:
        raise ValueError(f"top_k={top_k} exceeds the codebook size V={model.codebook_size}; allowed: 1..{model.codebook_size}")


def resolve_arguments(model: ImageTokenModel, method, window, sampling, draft_init, refresh, seed: int = 0,
                      preset: str | None = None):
    """``generate``'s method, window, drafting and sampling arguments checked and resolved (None -> the
    preset's, else the model's defaults), shared with :class:`csdgen.engine.ContinuousBatch`.

    Args:
        model, method, window, sampling, draft_init, refresh, seed, preset: as :func:`generate` takes them
            (``refresh`` None: the method's default, :func:`csdgen.models.defaults.method_refresh`; ``seed``
            an integer in ``0 .. 2**63 - 1``).

    Returns:
        ``(rule, window, draft_init, sampling, settings)``; ``settings`` is what
        :attr:`GenerationResult.settings` records (the window is the width used: a window
        longer than the image is capped at its N tokens).

    Raises:
        ValueError: as :func:`generate`.
    """
    _check_model(model)
    seed = check_seed(seed)
    _check_sampling(sampling)
    chosen = _preset(preset)
    if window is None:
        window = chosen.get("window", "auto")
    window = _check_window(window, model.num_image_tokens)
    rule, method_name = resolve_method(method, model, chosen)
    if refresh is None:
        refresh = chosen.get("refresh", method_refresh(method_name))
    if draft_init is None and rule.draft_init is None:
        draft_init = chosen.get("draft_init")
    if method_name == "ar":
        window = 1
    draft_init = resolve_draft_init(draft_init, rule.draft_init, rule.name)
    check_drafting(draft_init, refresh)
    sampling = _resolve_sampling(model, sampling)
    check_top_k(model, sampling.top_k)
    settings = {
        "method": method_name,
        "rule": rule.options(),
        "window": window,
        "draft_init": draft_init,
        "refresh": refresh,
        "seed": seed,
        "guidance_scale": sampling.guidance_scale,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
    }
    if sampling.guidance_schedule is not None and sampling.guided:
        settings["guidance_schedule"] = sampling.guidance_schedule.options()
    if sampling.top_n_sigma is not None:
        settings["top_n_sigma"] = sampling.top_n_sigma
        settings["top_n_sigma_centered"] = sampling.top_n_sigma_centered
    if preset is not None:
        settings["preset"] = preset
    return rule, window, draft_init, sampling, settings


def generate(
    model: ImageTokenModel,
    conditions: Any = None,
    *,
    batch_size: int | None = None,
    method: str | AcceptanceRule = "csd",
    window: int | str | None = None,
    seed: int = 0,
    image_indices: Sequence[int] | None = None,
    sampling: SamplingConfig | Mapping[str, Any] | None = None,
    draft_init: str | None = None,
    refresh: str | None = None,
    callback: Callable[[StepInfo], None] | None = None,
    profile: bool = False,
    tree: tuple[int, int] | None = None,
    preset: str | None = None,
    engine: str = "auto",
    compile: bool | None = None,
) -> GenerationResult:
    """Generate image tokens by AR decoding or speculative Jacobi decoding with an acceptance rule.

    Arguments left None come from ``model.defaults`` (the family's published or measured
    defaults, :class:`csdgen.models.defaults.FamilyDefaults`), else from the CSD reference, except
    ``window``: None is ``"auto"`` here (``model.defaults.window`` is the fixed width that ``csdgen
    compare`` and ``csdgen bench`` decode with when ``--window`` is left out; ``preset="paper"`` gives 16).

    Args:
        model: any :class:`~csdgen.models.base.ImageTokenModel`.
        conditions: what the model conditions on (class ids, prompts; one per image) or None.
        batch_size: number of images when ``conditions`` does not fix it: None or an integer >= 1 (with
            ``conditions``, None or their number).
        method: ``"ar"``, ``"sjd"``, ``"csd"`` (lambda and delta from ``model.defaults``),
            ``"addition"``, ``"jacobi"``, ``"gsd"``, ``"lantern"`` (default options; the last
            two take the model's codebook) or an :class:`~csdgen.acceptance.AcceptanceRule`
            instance such as ``CSD(lam=0.3)``.
        window: W, input slots of one Jacobi forward (each forward commits 1..W tokens per
            image), or ``"auto"`` (default): chosen every iteration to maximise measured tokens
            per second, 1 .. :data:`AUTO_MAX_WINDOW` (see :mod:`csdgen.engine`). Ignored (1) for ``"ar"``.
            A window longer than the image (N tokens) is capped at N, and the result's
            ``settings["window"]`` records the width used.
        seed: the run's seed, an integer in ``0 .. 2**63 - 1`` (:data:`csdgen.sampling.MAX_SEED`).
            Image ``i`` of the call draws from its own random stream keyed by ``(seed, image_indices[i])``.
        image_indices: the index of each image in the whole run (default ``0 .. B-1``); a
            caller splitting a run into batches passes the run-wide indices, so the batch size
            never changes an image (with a fixed window).
        sampling: guidance scale and schedule, temperature (0 = greedy), top-k, top-nσ, top-p.
            None (default): the model's, with its family's guidance schedule
            ``model.reference_guidance`` when it has one; a dict of changes to those, e.g.
            ``{"temperature": 0.5}`` (keys: :class:`~csdgen.sampling.SamplingConfig`'s fields; the
            model's guidance is kept); a :class:`~csdgen.sampling.SamplingConfig`: exactly these
            settings, its own defaults for the fields it leaves out (``guidance_scale`` 1.0, no
            guidance: a :class:`~csdgen.sampling.UnguidedSamplingWarning` says so when the
            model's default is guided). A schedule (:mod:`csdgen.guidance`) gives every image
            position its own scale, the same in every method: lossless methods stay exact.
        draft_init: ``"uniform"`` (CSD reference), ``"onehot"`` (SJD reference),
            ``"repeat-horizontal"`` or ``"repeat-vertical"``; None: what the rule needs
            (one-hot for GSD and LANTERN), else ``"uniform"``.
        refresh: ``"independent"`` (SJD's) or ``"coupled"`` (maximal coupling); both lossless.
            None: the method's default (:data:`csdgen.models.defaults.METHOD_REFRESH`: coupled
            for SJD and CSD, measured best on the built-in model; independent for the others).
        callback: called with a :class:`StepInfo` after every forward (progress bars, tests).
        profile: also time the forwards and :func:`verify` with device synchronisation
            (:attr:`GenerationResult.timings`; adds two syncs per iteration: for benchmarks).
        tree: ``(K, D)``: a draft tree at the root of every window (:mod:`csdgen.trees`): ``K``
            candidates at each of the first ``D`` window positions, verified exactly (recursive
            rejection sampling over siblings), the first branch continued as the window's chain;
            ``window`` counts the main path only, the forward also evaluates the
            ``K + ... + K^D - D`` side nodes. None (default): plain windows. Needs a session
            with ``forward_tree`` (``FunctionModel`` and every RaggedSession family: built-in /
            Llama, Janus, Emu3, Chameleon; see docs/frontier.md).
        preset: ``"paper"``: the CSD paper's settings for every argument left None (window 16,
            uniform drafts, independent refresh, and for ``method="csd"`` lambda 0.5 and delta
            0.65; :data:`csdgen.models.defaults.PRESETS`); given arguments win. None: none.
        engine: ``"static"``: the static-shape session (:mod:`csdgen.models._static`: a KV cache
            preallocated per row, windows run as width buckets 1, 2, 4, ..., 64, batch slots);
            ``"eager"``: the model's own session (for the transformers families a
            ``DynamicCache`` per row); ``"auto"`` (default): static wherever it applies (every
            RaggedSession family: built-in / Llama, Janus, Emu3, Chameleon), else eager. The
            engines compute the same logits up to floating-point summation order, so a float64
            model gives the same tokens and a float32 or bfloat16 one the same distribution
            (tested; see docs/engine.md). ``result.settings["engine"]`` says which one ran.
        compile: static engine only: ``torch.compile`` every forward shape on first use, on CUDA
            also captured as a CUDA graph; the compiled steps and their buffers belong to the model
            and are reused by its later calls (``csdgen.models._static_warmup.warmup`` makes them ahead of
            time). The shapes this call compiled are reported, with their seconds, in
            :attr:`GenerationResult.compile_seconds` (empty when every shape was already compiled).
            None (default): on CUDA only.

    Returns:
        :class:`GenerationResult` with tokens ``[B, N]`` int64 and per-image statistics.

    Raises:
        ValueError: not an image-token model, a seed outside ``0 .. 2**63 - 1``, sampling neither
            None, a dict nor a :class:`~csdgen.sampling.SamplingConfig` (or a dict with an unknown
            key), a rule's class instead of an instance,
            bad window, unknown method, draft initialisation or refresh mode, a draft
            initialisation the rule cannot use, bad sampling settings (e.g. top-k > V),
            ``image_indices`` not one distinct non-negative int per image, conditions the model rejects
            or a bare string / bytes or one condition (``33``) instead of a list of conditions,
            logits with NaN / +inf (or no allowed token) at some position, a bad ``tree``, a
            tree with ``method="ar"`` or with ``window=1``, a ``batch_size`` that is no integer >= 1 or
            differs from the number of conditions, a tree on a model whose session cannot evaluate trees, an
            unknown ``engine``, ``engine="static"`` (or ``compile=True``) on a model it does not
            apply to, ``compile=True`` with ``engine="eager"``, a ``callback`` that is not callable
            or a ``profile`` that is not a bool.
        MemoryError: the batch does not fit in the device's memory (one line; a smaller batch
            gives the same images).
    """
    check_conditions(conditions)
    count = None if conditions is None else _count(conditions)
    batch_size = _check_batch_size(batch_size, count)
    if conditions is None:
        count = batch_size
    if image_indices is not None and isinstance(count, int):  # before a static session allocates its cache
        checked_image_indices(image_indices, count)
    check_engine(engine, compile)
    if callback is not None and not callable(callback):  # else a TypeError after the prefill
        raise ValueError(f"callback={callback!r}: allowed None or a function called with a StepInfo after every forward")
    if not isinstance(profile, bool):  # profile="no" is truthy: it profiled
        raise ValueError(f"profile={profile!r}: allowed True (time the forwards and the verify step) or False")
    rule, window, draft_init, sampling, settings = resolve_arguments(model, method, window, sampling, draft_init,
                                                                     refresh, seed, preset)
    refresh, seed = settings["refresh"], settings["seed"]
    tree = check_tree(tree)
    if tree is not None and settings["method"] == "ar":
        raise ValueError(f"tree={tree!r} with method='ar': a draft tree needs a speculative method (e.g. 'sjd')")
    if tree is not None and window == 1 and model.num_image_tokens > 1:  # no draft slot: the tree would be dropped
        raise ValueError(f"tree={tree!r} with window=1: a draft tree grows from the window's drafts; allowed: "
                         "window >= 2 or 'auto'")
    if tree is None:
        loop = _Loop(model, rule, window, seed, sampling, draft_init, refresh, callback, profile, engine=engine,
                     compile=compile)
    else:
        settings["tree"] = list(tree)
        loop = _TreeLoop(model, rule, window, seed, sampling, draft_init, refresh, callback, profile, tree=tree,
                         engine=engine, compile=compile)
    try:
        return loop.run(conditions, batch_size, image_indices, settings)
    except RuntimeError as exc:  # torch.OutOfMemoryError (CUDA) is a RuntimeError too
        if not _out_of_memory(exc):
            raise
        images = batch_size if conditions is None else _count(conditions)
        raise MemoryError(f"decoding {images} images at once ran out of {torch.device(model.device).type} memory "
                          f"({str(exc).splitlines()[0][:120]}); allowed: a smaller batch, e.g. csdgen.save_run(..., "
                          f"batch_size=8) or csdgen.runs.generate_batches, which give the same images") from None


def check_conditions(conditions, name: str = "conditions") -> None:
    """Refuse one bare string (or bytes) where a list of conditions is asked for: it would be read
    letter by letter, one image per character; and one bare condition that is no list at all (a
    class index ``33``: ``TypeError: 'int' object is not iterable`` from deep inside the model).

    Raises:
        ValueError: ``"conditions='red apple': give a list, e.g. ['red apple']"``, ``"conditions=33: ..."``
            (an object whose repr is longer than 80 characters named by its type: ``conditions=<a GenerationResult>``).
    """
    if isinstance(conditions, (str, bytes)):
        from ..class_names import shown

        text = shown(conditions if isinstance(conditions, str) else conditions.decode("utf-8", "replace"))
        raise ValueError(f"{name}={text!r}: give a list (one condition per image), e.g. [{text!r}]")
    if conditions is not None:
        try:
            iter(conditions)
        except TypeError:
            text = repr(conditions)
            if len(text) > 80:  # an object of another kind (a GenerationResult): its type, not its every field
                raise ValueError(f"{name}=<a {type(conditions).__name__}>: give a list (one condition per image), "
                                 "e.g. [0, 'red apple']") from None
            raise ValueError(f"{name}={text}: give a list (one condition per image), e.g. [{text}]") from None


def _out_of_memory(exc: RuntimeError) -> bool:
    text = str(exc)
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(exc, oom)) or "can't allocate memory" in text or "out of memory" in text


def _check_batch_size(batch_size, count: int | str | None) -> int | None:
    """``batch_size`` as an ``int`` (None stays None), checked before any model work against ``count``, the
    number of conditions (:func:`_count`; None without conditions)."""
    if batch_size is None:
        return None
    from ..integers import as_integer

    value = as_integer(batch_size)
    if value is None or value < 1:
        raise ValueError(f"batch_size={batch_size!r}: allowed None or an integer >= 1 (the number of images when "
                         "conditions is None)")
    if isinstance(count, int) and value != count:
        allowed = f"None or {count}" if count else "a list of conditions with one per image"
        raise ValueError(f"batch_size={value} differs from the {count} conditions given; allowed: {allowed}")
    return value


def _count(conditions) -> int | str:
    try:
        return len(conditions)
    except TypeError:
        return "the"
