"""The decoding loop (:class:`_Loop`): draft -> forward -> verify -> commit -> roll back for every
image of the batch at its own committed length, until every image is complete (the algorithm in
:mod:`csdgen.engine`)."""

from __future__ import annotations

import time

import torch

from ..drafting import init_drafts
from ..sampling import entropy, sample, stream_uniforms, target_probs
from .results import Decision, GenerationResult, ImageStats, StepInfo
from .streams import _INIT, _KINDS, _Y
from .verification import Verdict, verify
from .window import AUTO_MAX_WINDOW, _AutoWindow


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Loop:
    """State of one ``generate`` call (see :mod:`csdgen.engine` for the algorithm).

    Image state lives in ``[B, N + slack]`` buffers (the slack columns absorb the padding slots
    of windows near the image end, so every scatter has distinct in-range positions); the
    session holds only the images still decoding (``self.active``, their image indices).
    """

    def __init__(self, model, rule, window, seed, sampling, draft_init, refresh, callback, profile):
        self.model, self.rule, self.window, self.seed, self.sampling = model, rule, window, seed, sampling
        self.draft_init, self.refresh, self.callback, self.profile = draft_init, refresh, callback, profile
        self.device = torch.device(model.device)
        self.max_width = AUTO_MAX_WINDOW if window == "auto" else window
        self.auto = _AutoWindow(min(self.max_width, max(model.num_image_tokens - 1, 1))) if window == "auto" else None
        self.timings = {"forward": 0.0, "verify": 0.0} if profile else {}

    # -- random numbers -------------------------------------------------------------------------

    def _uniforms(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """``[_KINDS, A, width]`` float64 for the active images ``rows`` at their own forward count."""
        return stream_uniforms(self.seed, self.indices[rows], self.steps_per_image[rows], _KINDS, width)

    # -- main loop ------------------------------------------------------------------------------

    def run(self, conditions, batch_size, image_indices, settings) -> GenerationResult:
        model = self.model
        N, dev = model.num_image_tokens, self.device
        _synchronize(dev)
        began = time.perf_counter()
        session = model.start(conditions, batch_size, self.sampling.guided)
        self._opened(session)
        self.B = B = session.batch_size
        self.indices = self._image_indices(image_indices, B)
        slack = self.max_width + 2
        self.tokens = torch.zeros(B, N + slack, dtype=torch.long, device=dev)
        self.decisions = torch.full((B, N + slack), int(Decision.SAMPLED), dtype=torch.int8, device=dev)
        self.entropy = torch.zeros(B, N + slack, device=dev)
        self.entered = torch.zeros(B, N + slack, dtype=torch.long, device=dev)  # forward count when a draft was initialised
        self.steps_per_image = torch.zeros(B, dtype=torch.long, device=dev)
        self.committed = torch.ones(B, dtype=torch.long, device=dev)
        self.commit_log: list[torch.Tensor] = []
        self.widths: list[int] = []
        self.active = torch.arange(B, device=dev)
        self.active_host = torch.arange(B)

        logits = session.prefill()
        q, bad = target_probs(logits.cond, logits.uncond, self.sampling, check=True)
        u = self._uniforms(self.active, 1)
        self.tokens[:, 0] = sample(q[:, 0], u[_Y, :, 0])
        self.entropy[:, 0] = entropy(q[:, 0])
        self.steps_per_image += 1
        self.commit_log.append(torch.ones(B, dtype=torch.long, device=dev))
        self.steps = 1
        committed_host, _ = self._sync(self.committed, bad, None)
        self._notify(session)

        self.prev = None  # (q [A, W, V], widths [A], shift [A]) of the last forward, for carried drafts
        probe = N >= 3 and self.PROBE  # the first iteration checks that the cache rolls back (csdgen.engine's docstring)
        checked = False
        mark = time.perf_counter()
        while len(self.active_host):
            c_host = committed_host[self.active_host]
            limit = int((N - c_host).max())
            width = min(self.auto.choose(limit) if self.auto else self.window, limit)
            r_counts = self._iterate(session, width, c_host, probe)
            self.steps += 1
            self.widths.append(width)
            committed_host, counts = self._sync(self.committed, self._bad, r_counts)
            new_c = committed_host[self.active_host]
            self._rollback(session, new_c - 1)
            if not checked and (probe or not self.PROBE):
                self._check_rollback(session, new_c - 1)
            probe, checked = False, True
            if self.auto is not None:
                now = time.perf_counter()
                self.auto.observe(width, now - mark, *counts)
                mark = now
            alive = (new_c < N).nonzero()[:, 0]
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
        settings = {**settings}
        return GenerationResult(self.tokens[:, :N].clone(), self._image_stats(), self.steps, seconds, settings,
                                widths=self.widths, timings=self.timings)

    def _image_indices(self, image_indices, B: int) -> torch.Tensor:
        if image_indices is None:
            return torch.arange(B, device=self.device)
        values = list(image_indices)
        if len(values) != B or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise ValueError(f"image_indices={values!r}: allowed one integer >= 0 per image ({B} images)")
        return torch.tensor(values, dtype=torch.long, device=self.device)

    #: feed one extra probe slot in the first iteration (the tree loop checks its compaction instead)
    PROBE = True

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
        alive_dev = alive.to(self.device)
        self.active = self.active[alive_dev]
        q, widths, shift = self.prev
        self.prev = (q[alive_dev], widths[alive_dev], shift[alive_dev])

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
            raise ValueError("the model returned logits with NaN or +inf (or no allowed token) at some position; "
                             "allowed: finite or -inf logits with at least one finite logit per position "
                             "(check the model weights, inputs and masks)")
        committed_host = values[:B].long()
        rest = values[B + 1 :]
        if counts is None:
            return committed_host, None
        half = len(rest) // 2
        return committed_host, (rest[:half].tolist(), rest[half:].tolist())

    def _notify(self, session) -> None:
        if self.callback is not None:
            N = self.model.num_image_tokens
            self.callback(StepInfo(self.steps, self.committed, self.tokens[:, :N], session, self.active_host.clone(),
                                   self.decisions[:, :N], self.entropy[:, :N]))

    # -- one iteration --------------------------------------------------------------------------

    def _drafts(self, rows, c, W: int, u_init: torch.Tensor):
        """Drafts ``x`` ``[A, W]`` at positions ``c .. c + W - 1`` and their distributions ``p`` ``[A, W, V]``."""
        V, dev = self.model.codebook_size, self.device
        slot = torch.arange(W, device=dev)
        positions = c[:, None] + slot  # [A, W]
        tokens = self.tokens[rows]
        if self.prev is None:
            carried = torch.zeros(len(rows), dtype=torch.long, device=dev)
        else:
            prev_q, prev_widths, shift = self.prev
            carried = (prev_widths - shift).clamp(0, W)  # [A] drafts left by the last forward
        new_tokens, new_probs = init_drafts(self.draft_init, tokens, c + carried, W, V, self.model.grid[1], u_init,
                                            positions=positions)
        is_carried = slot[None] < carried[:, None]  # [A, W]
        x = torch.where(is_carried, tokens.gather(1, positions), new_tokens)
        if self.prev is None:
            p = new_probs
        else:
            source = (shift[:, None] + slot).clamp(max=prev_q.shape[1] - 1)
            old = prev_q.gather(1, source[..., None].expand(-1, -1, V)).to(new_probs.dtype)
            p = torch.where(is_carried[..., None], old, new_probs)
        self.tokens[rows] = tokens.scatter(1, positions, x)
        if self.auto is not None:
            entered = self.entered[rows]
            now = self.steps_per_image[rows][:, None].expand_as(positions)
            self.entered[rows] = entered.scatter(1, positions, torch.where(is_carried, entered.gather(1, positions), now))
        return x, p

    def _iterate(self, session, W: int, c_host: torch.Tensor, probe: bool) -> torch.Tensor | None:
        """One forward for the active images; returns auto's ``[2, AGES]`` acceptance counts by draft age (or None)."""
        N, dev = self.model.num_image_tokens, self.device
        rows = self.active
        c = self.committed[rows]  # [A]
        widths = (N - c).clamp(max=W)  # [A] valid output slots per image
        widths_host = (N - c_host).clamp(max=W)
        u = self._uniforms(rows, W)
        x, p = self._drafts(rows, c, W, u[_INIT])
        if self.auto is not None:
            self._ages_entered = self.entered[rows].gather(1, c[:, None] + torch.arange(W, device=dev))
        # inputs: the last committed token, then the drafts (plus, once, one probe slot to roll back)
        fed_width, fed_widths = W, widths_host
        if probe:
            fed_widths = torch.clamp(N - c_host, max=W + 1)
            widths_host = fed_widths - 1
            widths = (N - c).clamp(max=W + 1) - 1
            fed_width = W + 1
        inputs = self.tokens[rows].gather(1, (c - 1)[:, None] + torch.arange(fed_width, device=dev))
        if self.profile:
            _synchronize(dev)
            t0 = time.perf_counter()
        logits = session.forward(inputs, c_host - 1, fed_widths)
        cond = logits.cond[:, :W]
        uncond = None if logits.uncond is None else logits.uncond[:, :W]
        slot = torch.arange(W, device=dev)
        valid = slot[None] < widths[:, None]
        q, self._bad = target_probs(cond, uncond, self.sampling, valid=valid, check=True)
        if self.profile:
            _synchronize(dev)
            t1 = time.perf_counter()
        verdict = verify(self.rule, self.refresh, x, p, q, widths, u)
        if self.profile:
            _synchronize(dev)
            self.timings["forward"] += t1 - t0
            self.timings["verify"] += time.perf_counter() - t1
        r = verdict.accepted
        self._commit(rows, c, verdict, q, widths)
        self.prev = (q, widths, r + 1)
        return self._auto_counts(rows, r, widths)

    def _auto_counts(self, rows: torch.Tensor, r: torch.Tensor, widths: torch.Tensor) -> torch.Tensor | None:
        """``[2, AGES]`` acceptance counts by draft age for ``window="auto"`` (None for a fixed window);
        called after the commit step, with ``self._ages_entered`` read before it."""
        dev = self.device
        if self.auto is None:
            return None
        slot = torch.arange(self._ages_entered.shape[1], device=dev)
        # acceptance counts by draft age, for the width chooser (ages read before the commit step)
        age = (self.steps_per_image[rows][:, None] - 1 - self._ages_entered).clamp(0, _AutoWindow.AGES - 1)
        is_draft = slot[None] < (widths - 1)[:, None]
        reached = is_draft & (slot[None] <= r[:, None])
        rejected = is_draft & (slot[None] == r[:, None])
        counts = torch.zeros(2, _AutoWindow.AGES, dtype=torch.long, device=dev)
        counts[0].scatter_add_(0, age.reshape(-1), reached.reshape(-1).long())
        counts[1].scatter_add_(0, age.reshape(-1), rejected.reshape(-1).long())
        return counts

    def _commit(self, rows, c, verdict: Verdict, q, widths) -> None:
        W = verdict.tokens.shape[1]
        slot = torch.arange(W, device=self.device)
        positions = c[:, None] + slot  # [A, W]; slots >= widths land in the slack columns or beyond the commit
        r_col = verdict.accepted[:, None]
        decided = slot[None] <= r_col
        self.tokens[rows] = self.tokens[rows].scatter(1, positions, verdict.tokens)
        old_codes = self.decisions[rows].gather(1, positions)
        self.decisions[rows] = self.decisions[rows].scatter(1, positions, torch.where(decided, verdict.decisions, old_codes))
        old_h = self.entropy[rows].gather(1, positions)
        self.entropy[rows] = self.entropy[rows].scatter(1, positions, torch.where(decided, entropy(q).to(old_h.dtype), old_h))
        new_c = c + verdict.accepted + 1
        self.committed[rows] = new_c
        self.steps_per_image[rows] += 1
        log = torch.full((self.B,), -1, dtype=torch.long, device=self.device)
        log[rows] = verdict.accepted + 1
        self.commit_log.append(log)

    def _image_stats(self) -> list[ImageStats]:
        log = torch.stack(self.commit_log, dim=1).cpu()  # [B, steps]; -1 where an image had finished
        N = self.model.num_image_tokens
        steps = self.steps_per_image.cpu()
        decisions, entropies = self.decisions[:, :N].cpu(), self.entropy[:, :N].cpu()
        stats = []
        for b in range(self.B):
            row = log[b]
            stats.append(ImageStats(steps=int(steps[b]), num_tokens=N, committed_per_step=row[row >= 0].tolist(),
                                    decisions=decisions[b], entropy=entropies[b]))
        return stats
