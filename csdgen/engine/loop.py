"""The decoding loop (:class:`_Loop`): draft -> forward -> verify -> commit -> roll back for every
image of the batch at its own committed length, until every image is complete (the algorithm in
:mod:`csdgen.engine`)."""

from __future__ import annotations

import time

import torch

from ..drafting import init_drafts
from ..guidance import guidance_at, guidance_table
from ..integers import integers_per_image
from ..models._static import open_engine
from ..sampling import ENTROPY_EPS, MAX_SEED, entropy, invalid_logits, sample, stream_uniforms, target_probs
from ..transfer import to_device
from .results import Decision, GenerationResult, ImageStats, StepInfo
from .streams import _INIT, _KINDS, _Y
from .verification import Verdict, verify
from .window import _AutoWindow
from .window_state import AGE_GROUPS, AUTO_MAX_WINDOW, DEPTH_EDGES, _shared_state, depth_bucket, prior_wide_margin


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def checked_image_indices(image_indices, count: int) -> list[int]:
    """``image_indices`` as ``count`` distinct ints in ``0 .. 2**63 - 1`` (:func:`csdgen.generate`'s argument).

    Raises:
        ValueError: not one integer per image, out of range, or an index given twice (one seed and index is one
            random stream: the two images would share every draw).
    """
    values = integers_per_image("image_indices", image_indices, count, 0, MAX_SEED)
    twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if twice is not None:
        raise ValueError(f"image_indices: index {twice} is given twice; allowed: distinct indices (images with the "
                         f"same seed and index draw the same random numbers)")
    return values


class _Loop:
    """State of one ``generate`` call (see :mod:`csdgen.engine` for the algorithm).

    Image state lives in ``[B, N + slack]`` buffers (the slack columns absorb the padding slots
    of windows near the image end, so every scatter has distinct in-range positions); the
    session holds only the images still decoding (``self.active``, their image indices).

    The draft distributions of the pending drafts live in a ring ``draft_probs`` ``[B, R, V]``
    (``R`` the widest window; image position ``i`` in ring slot ``i mod R``), valid for image
    positions ``committed .. draft_end - 1``: every forward writes its targets there (they are the
    distributions the refreshed drafts were drawn from), and a narrower window leaves the drafts
    past its end, and their distributions, for a later wider one (``window="auto"`` switches widths).
    The pending drafts always lie in ``[committed, committed + R)``, so their ring slots are distinct.
    """

    def __init__(self, model, rule, window, seed, sampling, draft_init, refresh, callback, profile, tree=None,
                 engine="auto", compile=None):
        self.model, self.rule, self.window, self.seed, self.sampling = model, rule, window, seed, sampling
        self.engine, self.compile = engine, compile
        self.draft_init, self.refresh, self.callback, self.profile = draft_init, refresh, callback, profile
        self.device = torch.device(model.device)
        self.max_width = AUTO_MAX_WINDOW if window == "auto" else window
        self.auto = None
        if window == "auto":
            tree_key = None if tree is None else tuple(tree)
            learned = _shared_state(model, (sampling.guided, tree_key, engine, compile),
                                    (rule.name, repr(sorted(rule.options().items())), draft_init, refresh,
                                     repr(sampling), tree_key))
            self.auto = _AutoWindow(min(self.max_width, max(model.num_image_tokens - 1, 1)), learned,
                                    prior_wide_margin(model))
        self.timings = {"forward": 0.0, "verify": 0.0} if profile else {}
        # [N] guidance scale per image position (a schedule, csdgen.guidance), or None: the constant scale
        self.guidance = guidance_table(sampling.guidance_schedule if sampling.guided else None, sampling.guidance_scale,
                                       model.num_image_tokens, tuple(model.grid), self.device)

    def _scales(self, positions: torch.Tensor) -> torch.Tensor | None:
        """``[..., 1]`` guidance scales of the targets at image ``positions`` (None without a schedule).

        A function of the position only, never of the iteration or the window: a position's target is
        the same whether it is sampled alone or drafted anywhere in a window (lossless rules stay exact).
        """
        return None if self.guidance is None else guidance_at(self.guidance, positions)

    # -- random numbers -------------------------------------------------------------------------

    def _uniforms(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """``[_KINDS, A, width]`` float64 for the active images ``rows`` at their own forward count."""
        return stream_uniforms(self.seeds[rows], self.indices[rows], self.steps_per_image[rows], _KINDS, width)

    # -- per-image buffers ----------------------------------------------------------------------

    #: the ``[B, ...]`` tensors holding one row per image (kept together when images join or leave)
    ROW_BUFFERS = ("tokens", "decisions", "entropy", "entered", "steps_per_image", "committed", "log", "indices", "seeds",
                   "draft_probs", "draft_end")

    def _allocate(self, B: int) -> None:
        """Empty per-image state for ``B`` images (``[B, N + slack]`` image buffers, see the class docstring)."""
        N, dev = self.model.num_image_tokens, self.device
        slack = self.max_width + 2
        self.B = B
        self.tokens = torch.zeros(B, N + slack, dtype=torch.long, device=dev)
        self.decisions = torch.full((B, N + slack), int(Decision.SAMPLED), dtype=torch.int8, device=dev)
        self.entropy = torch.zeros(B, N + slack, device=dev)
        self.entered = torch.zeros(B, N + slack, dtype=torch.long, device=dev)  # forward count when a draft was initialised
        self.steps_per_image = torch.zeros(B, dtype=torch.long, device=dev)
        self.committed = torch.ones(B, dtype=torch.long, device=dev)
        self.log = torch.full((B, N), -1, dtype=torch.long, device=dev)  # tokens committed at each of an image's steps
        self.indices = torch.zeros(B, dtype=torch.long, device=dev)
        self.seeds = torch.zeros(B, dtype=torch.long, device=dev)
        # [B, R, V] draft distributions of the pending drafts, and [B] the end of their positions (class docstring)
        self.draft_probs = torch.zeros(B, self.max_width, self.model.codebook_size, device=dev)
        self.draft_end = torch.zeros(B, dtype=torch.long, device=dev)

    def _prefill(self, session, slots: torch.Tensor) -> torch.Tensor:
        """Prefill ``session`` (its rows are the images at buffer rows ``slots``) and commit their token 0.

        Returns the ``[]`` bool non-finite flag of the prefill's target distribution (not synced)."""
        logits = session.prefill()
        self._raw_logits = (logits.cond, logits.uncond, None)  # read only to explain a non-finite flag
        q, bad = target_probs(logits.cond, logits.uncond, self.sampling, check=True,
                              guidance=self._scales(torch.zeros(len(slots), 1, dtype=torch.long, device=slots.device)))
        u = self._uniforms(slots, 1)
        self.tokens[slots, 0] = sample(q[:, 0], u[_Y, :, 0])
        self.entropy[slots, 0] = entropy(q[:, 0], eps=ENTROPY_EPS).to(self.entropy.dtype)
        self.steps_per_image[slots] += 1
        self.log[slots, 0] = 1
        return bad

    # -- main loop ------------------------------------------------------------------------------

    def run(self, conditions, batch_size, image_indices, settings) -> GenerationResult:
        try:
            return self._run(conditions, batch_size, image_indices, settings)
        finally:
            # the model-owned buffer set goes back to the model's store now, not when the session is
            # garbage collected: a reference held elsewhere (a kept StepInfo's session, a cycle)
            # would make the next call allocate a second set
            session, self.session = getattr(self, "session", None), None
            release = getattr(session, "release", None)
            if release is not None:
                release()

    def _run(self, conditions, batch_size, image_indices, settings) -> GenerationResult:
        model = self.model
        N, dev = model.num_image_tokens, self.device
        _synchronize(dev)
        began = time.perf_counter()
        session = self.session = open_engine(model.start(conditions, batch_size, self.sampling.guided), self.engine, self.compile)
        if self.auto is not None:
            self.auto.buckets = getattr(session, "width_buckets", None)
        self._opened(session)
        B = session.batch_size
        self._allocate(B)
        self.indices = self._image_indices(image_indices, B)
        self.seeds = torch.full((B,), _signed64(self.seed), dtype=torch.long, device=dev)
        self.widths: list[int] = []
        self.active = torch.arange(B, device=dev)
        self.active_host = torch.arange(B)

        bad = self._prefill(session, self.active)
        self.steps = 1
        self.committed_host, _ = self._sync(self.committed, bad, None)
        self._notify(session)

        # the first iteration checks that the cache rolls back (csdgen.engine's docstring); a static
        # session's rollback is a length update, checked after the first iteration without a probe
        self._probe = N >= 3 and self.PROBE and getattr(session, "rollback_probe", True)
        self._checked = False
        self._mark = time.perf_counter()
        if N == 1:  # the prefill's token is the whole image: no window to run
            self.active_host = self.active_host[:0]
        while len(self.active_host):
            alive = self._advance()
            if len(alive) < len(self.active_host):
                self._notify(session)
                if len(alive):
                    session.select_rows(alive)
                    self._select(alive)
                else:
                    self.active_host = self.active_host[:0]
                continue
            self._notify(session)
        _synchronize(dev)
        seconds = time.perf_counter() - began
        if self.auto is not None:
            self.auto.finish()
        settings = {**settings, "engine": getattr(session, "engine", "eager"),
                    "compile": bool(getattr(session, "compile", False))}
        return GenerationResult(self.tokens[:, :N].clone(), self._image_stats(), self.steps, seconds, settings,
                                widths=self.widths, timings=self.timings,
                                auto_log=self.auto.summary() if self.auto is not None else {},
                                compile_seconds=dict(getattr(session, "compile_seconds", {})))

    def _advance(self) -> torch.Tensor:
        """One iteration (draft, forward, verify, commit, roll back) for the session's rows.

        Returns ``[A']`` int64 CPU: the session rows whose images are still decoding afterwards.
        """
        N, session = self.model.num_image_tokens, self.session
        c_host = self.committed_host[self.active_host]
        # a row admitted unprefilled (c 0) takes its prefill in this window's first slot and is then
        # where a prefilled one starts: the window is chosen as for that one (c 1)
        left = N - c_host.clamp(min=1)
        limit = int(left.max())
        if self.auto is not None:
            if self.batch_priced:  # a served batch: priced row by row, timed by the slots the forward runs
                A = len(self.active_host)
                slots = getattr(session, "batch_slots", A)
                width = min(self.auto.choose(limit, slots, 1.0, remaining=left.numpy()), limit)
            else:
                lag = self.auto.laggard_ratio(c_host, self.steps) if self.paced_by_laggard else 1.0
                width = min(self.auto.choose(limit, len(self.active_host), lag), limit)
        else:
            width = min(self.window, limit)
        probe = self._probe
        r_counts = self._iterate(session, width, c_host, probe)
        self.steps += 1
        self.widths.append(width)
        self.committed_host, counts = self._sync(self.committed, self._bad, r_counts)
        new_c = self.committed_host[self.active_host]
        self._rollback(session, new_c - 1)
        if not self._checked:
            self._check_rollback(session, new_c - 1)
            self._checked = True
        self._probe = False
        if self.auto is not None:
            now = time.perf_counter()
            # Python's sums of the host lengths: four CPU tensor ops cost tens of µs after a forward
            tokens = (sum(new_c.tolist()) - sum(c_host.tolist())) / len(c_host)
            self.auto.observe(width, now - self._mark, *(counts or (None, None)), tokens=tokens)
            self._mark = now
        return (new_c < N).nonzero()[:, 0]

    def _image_indices(self, image_indices, B: int) -> torch.Tensor:
        if image_indices is None:
            return torch.arange(B, device=self.device)
        return torch.tensor(checked_image_indices(image_indices, B), dtype=torch.long, device=self.device)

    #: feed one extra probe slot in the first iteration (the tree loop checks its compaction instead)
    PROBE = True
    #: ``window="auto"`` prices the batch towards its slowest image's pace (:meth:`_AutoWindow.choose`'s
    #: ``lag``): the batch ends with it. Continuous batching sets it False (new images join, and its
    #: images started at different steps)
    paced_by_laggard = True
    #: ``window="auto"`` prices the batch it runs row by row (:meth:`_AutoWindow.choose`'s ``remaining``),
    #: its times kept per batch slots the forward runs (``session.batch_slots`` where the session has
    #: them, else the images): continuous batching sets it True (its rows are at different places of
    #: their images, and the images in a bucket of the static session change while its cost does not)
    batch_priced = False

    def _opened(self, session) -> None:
        """Hook: the session was just opened (the tree loop checks that it can evaluate trees)."""

    def _rollback(self, session, lengths: torch.Tensor) -> None:
        """Hook: keep image positions ``0 .. lengths - 1`` of every session row after an iteration."""
        session.rollback(lengths)

    def _sync_extra(self) -> torch.Tensor | None:
        """Hook: more numbers the iteration's one host sync carries (read back as ``self._extra_host``)."""
        return None

    def _check_rollback(self, session, expected: torch.Tensor) -> None:
        lengths = session.cache_lengths
        if not torch.equal(lengths.cpu(), expected):
            raise RuntimeError(f"the model's session did not roll back its cache: holds {lengths.tolist()} positions, "
                               f"expected {expected.tolist()}; its cache cannot be used for speculative decoding")

    def _select(self, alive: torch.Tensor) -> None:
        """Keep the session rows ``alive`` (CPU indices into the active rows)."""
        self.active_host = self.active_host[alive]
        self.active = self.active[to_device(alive, self.device)]

    def _sync(self, committed: torch.Tensor, bad: torch.Tensor, counts: torch.Tensor | None):
        """The one host sync per iteration: committed lengths, the non-finite flag, auto's counts."""
        parts = [committed.double(), bad.reshape(1).double()]
        if counts is not None:
            parts.append(counts.reshape(-1).double())
        extra = self._sync_extra()
        if extra is not None:
            parts.append(extra.reshape(-1).double())
        values = torch.cat(parts).cpu()
        if extra is not None:
            self._extra_host = values[len(values) - extra.numel() :].long().reshape(extra.shape)
            values = values[: len(values) - extra.numel()]
        B = committed.shape[0]
        if bool(values[B]):
            raise ValueError(self._non_finite_message())
        committed_host = values[:B].long()
        rest = values[B + 1 :]
        if counts is None:
            return committed_host, None
        half = len(rest) // 2
        return committed_host, (rest[:half].tolist(), rest[half:].tolist())

    def _non_finite_message(self) -> str:
        """What the non-finite flag means: the model's logits, or the sampling settings overflowing float32."""
        raw = getattr(self, "_raw_logits", None)
        s = self.sampling
        if raw is not None:
            cond, uncond, valid = raw
            model_bad = invalid_logits(cond, valid) | (invalid_logits(uncond, valid) if uncond is not None else False)
            one_sided = (uncond is not None and s.guidance_scale != 1
                         and bool(((torch.isneginf(cond) ^ torch.isneginf(uncond))
                                   & (True if valid is None else valid[..., None])).any()))
            if not bool(model_bad) and one_sided:  # -inf + inf: no scale but 1 (or a schedule's 1) combines them
                return (f"the model's conditional and unconditional logits disagree on which tokens are -inf (one row "
                        f"allows a token the other excludes); guidance scale {s.guidance_scale:g} combines such a token "
                        f"to +inf or NaN (l_u + s (l_c - l_u)); allowed: -inf at the same tokens in both rows (a token "
                        f"both exclude), or guidance scale 1 (the conditional row alone)")
            if not bool(model_bad):
                return (f"the model's logits are finite, but guidance scale {s.guidance_scale:g} and temperature "
                        f"{s.temperature:g} make them overflow float32 (NaN or +inf after l_u + s (l_c - l_u) and / T); "
                        f"allowed: a smaller guidance scale or a larger temperature (e.g. guidance 1-10, temperature "
                        f"0.5-1.5, or 0 for greedy)")
        return ("the model returned logits with NaN or +inf (or no allowed token) at some position; "
                "allowed: finite or -inf logits with at least one finite logit per position "
                "(check the model weights, inputs and masks)")

    def _notify(self, session) -> None:
        if self.callback is not None:
            N = self.model.num_image_tokens
            # copies (on the device, no sync): the engine's buffers change at the next iteration, so a
            # StepInfo kept by the callback (history.append) read the last iteration's values
            self.callback(StepInfo(self.steps, self.committed.clone(), self.tokens[:, :N].clone(), session,
                                   self.active_host.clone(), self.decisions[:, :N].clone(), self.entropy[:, :N].clone()))

    # -- one iteration --------------------------------------------------------------------------

    def _drafts(self, rows, c, W: int, u_init: torch.Tensor):
        """Drafts ``x`` ``[A, W]`` at positions ``c .. c + W - 1`` and their distributions ``p`` ``[A, W, V]``."""
        V, dev = self.model.codebook_size, self.device
        slot = torch.arange(W, device=dev)
        positions = c[:, None] + slot  # [A, W]
        tokens = self.tokens[rows]
        carried = (self.draft_end[rows] - c).clamp(0, W)  # [A] drafts left by earlier forwards
        new_tokens, new_probs = init_drafts(self.draft_init, tokens, c + carried, W, V, self.model.grid[1], u_init,
                                            positions=positions)
        is_carried = slot[None] < carried[:, None]  # [A, W]
        x = torch.where(is_carried, tokens.gather(1, positions), new_tokens)
        old = self.draft_probs[rows[:, None], positions % self.draft_probs.shape[1]].to(new_probs.dtype)
        p = torch.where(is_carried[..., None], old, new_probs)
        self.tokens[rows] = tokens.scatter(1, positions, x)
        if self._counting(W):
            entered = self.entered[rows]
            now = self.steps_per_image[rows][:, None].expand_as(positions)
            self.entered[rows] = entered.scatter(1, positions, torch.where(is_carried, entered.gather(1, positions), now))
        return x, p

    def _iterate(self, session, W: int, c_host: torch.Tensor, probe: bool) -> torch.Tensor | None:
        """One forward for the active images; returns auto's draft counts by depth and age (:meth:`_auto_counts`) or None."""
        N, dev = self.model.num_image_tokens, self.device
        rows = self.active
        c = self.committed[rows]  # [A]
        widths = (N - c).clamp(max=W)  # [A] valid output slots per image
        widths_host = (N - c_host).clamp(max=W)
        # rows admitted unprefilled (ContinuousBatch.admit, committed length 0): their window is one
        # slot, fed their prompt's last token (the session's, at start -1), and they commit token 0 as
        # a prefill does (_prefill_first)
        unprefilled = c_host == 0
        fold = bool(unprefilled.any())
        if fold:
            first = c == 0
            widths = torch.where(first, 1, widths)
            widths_host = torch.where(unprefilled, 1, widths_host)
        u = self._uniforms(rows, W)
        x, p = self._drafts(rows, c, W, u[_INIT])
        if self._counting(W):
            self._ages_entered = self.entered[rows].gather(1, c[:, None] + torch.arange(W, device=dev))
        # inputs: the last committed token, then the drafts (plus, once, one probe slot to roll back)
        fed_width, fed_widths = W, widths_host
        if probe:  # the probe is one slot past the window, fed and rolled back; a window that reaches the image's end has none
            fed_widths = torch.clamp(N - c_host, max=W + 1)
            fed_width = W + 1
        columns = (c - 1)[:, None] + torch.arange(fed_width, device=dev)
        inputs = self.tokens[rows].gather(1, columns.clamp(min=0) if fold else columns)
        if self.profile:
            _synchronize(dev)
            t0 = time.perf_counter()
        logits = session.forward(inputs, c_host - 1, fed_widths)
        cond = logits.cond[:, :W]
        uncond = None if logits.uncond is None else logits.uncond[:, :W]
        slot = torch.arange(W, device=dev)
        valid = slot[None] < widths[:, None]
        q, self._bad = target_probs(cond, uncond, self.sampling, valid=valid, check=True,
                                    guidance=self._scales(c[:, None] + slot))  # slot j holds position c + j
        self._raw_logits = (cond, uncond, valid)
        if self.profile:
            _synchronize(dev)
            t1 = time.perf_counter()
        h = entropy(q, eps=ENTROPY_EPS)  # [A, W] once: the statistics' and CSD's relaxation's
        verdict = verify(self.rule, self.refresh, x, p, q, widths, u, target_entropy=h)
        if fold:
            verdict = _prefill_first(verdict, first, q, u)
        if self.profile:
            _synchronize(dev)
            self.timings["forward"] += t1 - t0
            self.timings["verify"] += time.perf_counter() - t1
        r = verdict.accepted
        self._commit(rows, c, verdict, q, widths, h)
        self._keep_drafts(rows, c, q, widths)
        return self._auto_counts(rows, r, widths, W)

    def _keep_drafts(self, rows: torch.Tensor, c: torch.Tensor, q: torch.Tensor, widths: torch.Tensor) -> None:
        """Store this forward's targets ``q`` ``[A, W, V]`` (slot ``j``: image position ``c + j``) as the
        draft distributions of the refreshed drafts, and extend the pending drafts' end to ``c + widths``.

        Drafts an earlier, wider forward left past ``c + W`` keep theirs (ring slots of positions
        ``c .. c + W - 1`` are distinct from those of ``c + W .. c + R - 1``); the padding slots past
        the image end land on ring slots of committed positions, which are never read."""
        R = self.draft_probs.shape[1]
        if q.dtype != self.draft_probs.dtype:  # float64 models: keep their targets exact
            self.draft_probs = self.draft_probs.to(q.dtype)
        positions = c[:, None] + torch.arange(q.shape[1], device=self.device)
        self.draft_probs[rows[:, None], positions % R] = q
        self.draft_end[rows] = torch.maximum(self.draft_end[rows], c + widths)

    def _counting(self, W: int) -> bool:
        """Whether an iteration of width ``W`` keeps ``window="auto"``'s draft bookkeeping (draft ages
        and counts): only with auto, and only when the window holds a draft (a width-1 forward tests
        none, and skipping the bookkeeping makes it cost what an AR iteration costs)."""
        return self.auto is not None and W > 1

    def _auto_counts(self, rows: torch.Tensor, r: torch.Tensor, widths: torch.Tensor, W: int) -> torch.Tensor | None:
        """``[2, buckets * AGE_GROUPS]`` draft counts (reached, rejected) by depth bucket and age group for
        ``window="auto"`` (None for a fixed window or a window without drafts, :meth:`_counting`);
        called after the commit step, with ``self._ages_entered`` read before it. A draft's depth is
        its slot (the drafts before it in this forward), its age the forwards it was refined by."""
        dev = self.device
        if not self._counting(W):
            return None
        slot = torch.arange(self._ages_entered.shape[1], device=dev)
        age = (self.steps_per_image[rows][:, None] - 1 - self._ages_entered).clamp(0, AGE_GROUPS - 1)
        cell = depth_bucket(slot)[None] * AGE_GROUPS + age  # [A, W]
        is_draft = slot[None] < (widths - 1)[:, None]
        reached = is_draft & (slot[None] <= r[:, None])
        rejected = is_draft & (slot[None] == r[:, None])
        counts = torch.zeros(2, len(DEPTH_EDGES) * AGE_GROUPS, dtype=torch.long, device=dev)
        counts[0].scatter_add_(0, cell.reshape(-1), reached.reshape(-1).long())
        counts[1].scatter_add_(0, cell.reshape(-1), rejected.reshape(-1).long())
        return counts

    def _commit(self, rows, c, verdict: Verdict, q, widths, h: torch.Tensor | None = None) -> None:
        """Write the verdict into the image buffers: tokens, decisions, the entropy of ``q`` (``h``
        ``[A, W]``, ``entropy(q, eps=ENTROPY_EPS)``; None: computed here) at the decided slots, lengths."""
        W = verdict.tokens.shape[1]
        slot = torch.arange(W, device=self.device)
        positions = c[:, None] + slot  # [A, W]; slots >= widths land in the slack columns or beyond the commit
        r_col = verdict.accepted[:, None]
        decided = slot[None] <= r_col
        self.tokens[rows] = self.tokens[rows].scatter(1, positions, verdict.tokens)
        old_codes = self.decisions[rows].gather(1, positions)
        self.decisions[rows] = self.decisions[rows].scatter(1, positions, torch.where(decided, verdict.decisions, old_codes))
        old_h = self.entropy[rows].gather(1, positions)
        h = entropy(q, eps=ENTROPY_EPS) if h is None else h
        self.entropy[rows] = self.entropy[rows].scatter(1, positions, torch.where(decided, h.to(old_h.dtype), old_h))
        new_c = c + verdict.accepted + 1
        self.committed[rows] = new_c
        self.log[rows, self.steps_per_image[rows].clamp(max=self.log.shape[1] - 1)] = verdict.accepted + 1
        self.steps_per_image[rows] += 1

    def _image_stats(self, slots: list[int] | None = None) -> list[ImageStats]:
        """Statistics of the images at buffer rows ``slots`` (default: all), read in one device -> host copy."""
        slots = list(range(self.B)) if slots is None else slots
        N = self.model.num_image_tokens
        pick = to_device(torch.tensor(slots, dtype=torch.long), self.device)
        # one copy: steps, the log (-1 after an image's last step), decisions and entropies, all exact in float64
        parts = [self.steps_per_image[pick][:, None], self.log[pick], self.decisions[pick, :N], self.entropy[pick, :N]]
        host = torch.cat([part.double() for part in parts], 1).cpu()
        steps, log, decisions, entropies = torch.split(host, [1, self.log.shape[1], N, N], 1)
        log, decisions, entropies = log.long(), decisions.to(self.decisions.dtype), entropies.to(self.entropy.dtype)
        stats = []
        for b in range(len(slots)):
            row = log[b]
            stats.append(ImageStats(steps=int(steps[b, 0]), num_tokens=N, committed_per_step=row[row >= 0].tolist(),
                                    decisions=decisions[b], entropy=entropies[b]))
        return stats


def _prefill_first(verdict: Verdict, first: torch.Tensor, q: torch.Tensor, u: torch.Tensor) -> Verdict:
    """The verdict with the rows ``first`` (``[A]`` bool: admitted unprefilled, a one-slot window at
    position 0) committing token 0 as :meth:`_Loop._prefill` does: sampled from the target ``q[:, 0]``
    with the image's prefill uniform (draw kind ``_Y``, slot 0 of its forward 0; ``u`` ``[_KINDS, A, W]``),
    decision SAMPLED, no draft accepted. So an image gets the same tokens whether it was prefilled
    at its admission or in the next iteration."""
    tokens, decisions = verdict.tokens.clone(), verdict.decisions.clone()
    tokens[:, 0] = torch.where(first, sample(q[:, 0], u[_Y, :, 0]), tokens[:, 0])
    decisions[:, 0] = torch.where(first, torch.full_like(decisions[:, 0], int(Decision.SAMPLED)), decisions[:, 0])
    return Verdict(torch.where(first, 0, verdict.accepted), tokens, decisions)


def _signed64(seed: int) -> int:
    """``seed mod 2**64`` as the int64 that holds the same bits (a seed tensor's form, :func:`stream_uniforms`)."""
    seed &= (1 << 64) - 1
    return seed - (1 << 64) if seed >= 1 << 63 else seed
