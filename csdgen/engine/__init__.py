"""The decoding engine: AR, speculative Jacobi decoding (SJD) and its relaxed variants (CSD, ...).

One iteration (Teng et al., 2024, "Accelerating Auto-regressive Text-to-Image Generation with
Training-free Speculative Jacobi Decoding"; the CSD paper's Algorithm 1), for every image ``b``
of the batch at its own committed length ``c_b``:

    draft -> forward -> verify -> commit -> roll back

* **draft**: image ``b``'s window feeds its image positions ``c_b - 1 .. c_b + n_b - 2``: its
  last committed token, then its pending drafts (``n_b = min(W, N - c_b)`` slots; the other
  slots of the ``[B, W]`` batch are padding the session masks out). Drafts left by earlier
  forwards are carried with their draft distribution (kept per image in a ring of the widest
  window's length, so a narrower window leaves the drafts past its end for a later wider one);
  new slots get drafts from the initialisation (:mod:`csdgen.drafting`).
* **forward**: one model call for the whole batch gives the target distribution ``q`` at
  positions ``c_b .. c_b + n_b - 1`` of every image.
* **verify** (:func:`verify`): the rule's acceptance probabilities for the whole window, the
  first rejection per image (vectorised, :func:`csdgen.acceptance.first_rejection`), a sample
  from the residual at that slot only, or a *bonus* sample from ``q`` at the last slot when
  every draft passed; drafts after the rejection are refreshed from ``q``.
* **commit**: image ``b`` commits its accepted drafts and the new token: ``c_b`` grows by 1 .. n_b.
* **roll back**: row ``b`` of the cache keeps positions ``0 .. c_b - 2`` (per-row lengths).

**Images are independent.** Every image's window starts at its own committed length (per-row
positions, attention masks and cache lengths: :mod:`csdgen.models._ragged`), and every random
number an image uses is a hash of ``(seed, image index, the image's own forward count, draw
kind, slot)`` (:func:`csdgen.sampling.stream_uniforms`). With a fixed window, an image's
tokens and number of forwards depend only on the seed, its index in the run
(``image_indices``) and its condition: not on the batch size or on the other images
(tested; equal up to float32 summation order of batched kernels, which can tip a decision:
bit-identical at the same batch size and thread count, or in float64). Finished images
leave the batch (:meth:`~csdgen.models.base.DecodingSession.select_rows`).

**Window ``"auto"``.** The width ``W`` of each iteration is chosen from the iteration times
measured on the running model per number of images decoding (a warm-up of one forward at each
of widths 1, 4, 16 and 32 the first time, then an exponential average kept current, with a
neighbouring width tried now and then when it is predicted close to the best) and the
acceptance seen so far as a function of a draft's depth in the window (the drafts accepted
before it in the same forward) and age (forwards it has been refined by), from which the tokens
committed per forward at every width are predicted: ``W = argmax E[tokens committed | W] / t(W)``
over ``1 .. AUTO_MAX_WINDOW``, 1 (plain AR) when nothing pays (:mod:`csdgen.engine.window`).
What it learned carries over to the next call on the same model. The choice depends on the past
only, so lossless rules stay exact; the widths are recorded (:attr:`GenerationResult.widths`),
and the predicted against the measured tokens and seconds per width (:attr:`GenerationResult.auto_log`).
Since measured times steer the widths, ``"auto"`` reproduces an image's *distribution*, not
its exact tokens: pass a fixed window for bit-reproducible images across runs and batch sizes.

**Draft trees** (``tree=(K, D)``, :mod:`csdgen.trees`): the first ``D`` draft positions of
every window hold ``K`` candidates (the draft and ``K - 1`` siblings drawn without replacement
from its draft distribution); one ``session.forward_tree`` evaluates every node, the siblings
are verified by recursive rejection sampling (exact), and the session keeps the winning path
(``session.keep_path``). A separate loop class (``_TreeLoop``); without a tree nothing changes.

**Non-finite logits.** NaN or +inf in a (guided) target distribution, or a position where
every token is -inf, raises ValueError at the iteration's host sync; -inf alone excludes a
token (:func:`csdgen.sampling.apply_guidance` keeps a token -inf in both rows at -inf). No
rule commits a draft the target distribution gives probability 0 (after top-k, top-p or a
family's mask): :func:`verify` sets such acceptance probabilities to 0.

**Cache check.** The first iteration feeds one extra probe slot past its window and rolls it
back, so every row's cache is cropped once at the start: a model whose cache cannot roll
back fails there, not after a long run.

**Continuous batching** (:class:`ContinuousBatch`, :mod:`~csdgen.engine.continuous`): the
same loop driven one iteration at a time, images admitted between iterations (their prefill
joined to the running session, :meth:`~csdgen.models.base.DecodingSession.admit`) and removed
when complete or cancelled; an admitted image decodes as it would alone (same seed, image
index and fixed window: same tokens). ``csdgen serve``'s scheduler drives it.

Host syncs: one per iteration (committed lengths, the non-finite flag and the acceptance
counts of ``"auto"``, in one transfer); what an iteration sends to the device travels in queued
copies (:mod:`csdgen.transfer`), and :class:`csdgen.engine.syncs.HostSyncCounter` counts syncs on
any device (tests/test_host_syncs.py). AR decoding is the loop with a window of 1.

Files (one idea each): :mod:`~csdgen.engine.results` (:class:`Decision`, :class:`ImageStats`,
:class:`StepInfo`, :class:`GenerationResult`), :mod:`~csdgen.engine.streams` (the kinds of
uniform streams an iteration draws), :mod:`~csdgen.engine.verification` (:func:`verify`,
:class:`Verdict`), :mod:`~csdgen.engine.methods` (method names and rules, window check, default
sampling), :mod:`~csdgen.engine.window` (``window="auto"``), :mod:`~csdgen.engine.loop` (the
loop), :mod:`~csdgen.engine.tree_loop` (the loop with draft trees),
:mod:`~csdgen.engine.generation` (the public :func:`generate`), :mod:`~csdgen.engine.continuous`
(:class:`ContinuousBatch`), :mod:`~csdgen.engine.syncs` (:class:`~csdgen.engine.syncs.HostSyncCounter`,
counting host syncs). :mod:`csdgen.decoding` re-exports
the public names. Modules outside the engine import only these public names, from
:mod:`csdgen.engine` itself (tests/test_layout.py). :class:`Decision` and the stream kinds are
defined below the engine, in :mod:`csdgen.decisions`.

The public names below are imported on first use (PEP 562 ``__getattr__``), so a core module
such as :mod:`csdgen.trees` can import :mod:`csdgen.engine.results` without running the loop's
modules (which import :mod:`csdgen.trees` themselves).
"""

from .._lazy import lazy_names

_LAZY = {
    "Decision": ".results",
    "ImageStats": ".results",
    "StepInfo": ".results",
    "GenerationResult": ".results",
    "Verdict": ".verification",
    "verify": ".verification",
    "generate": ".generation",
    "METHODS": ".methods",
    "AUTO_MAX_WINDOW": ".window",
    "ContinuousBatch": ".continuous",
    "FinishedImage": ".continuous",
    "resolve_arguments": ".generation",
    "check_conditions": ".generation",
    "check_engine": ".generation",
    "check_top_k": ".generation",
    "resolve_method": ".methods",
    "default_sampling": ".methods",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
