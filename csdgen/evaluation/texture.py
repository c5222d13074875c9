"""Where the speed comes from: how tokens were decided, by local image texture and by target entropy.

The CSD paper's premise (Section 3) is that smooth image regions have a high target entropy
and are where the entropy-based relaxation accepts drafts, while fine textures have a low
entropy and keep the exact test. This module measures that premise on any model's outputs:

* **texture** of an image token: the mean gradient magnitude of the decoded image over the
  patch under the token. Per pixel, the gradient magnitude is the Euclidean norm over the
  colour channels of the forward differences ``x[i, j+1] - x[i, j]`` and
  ``x[i+1, j] - x[i, j]`` (the last row and column are replicated, so their difference is 0),
  in the image's own units per pixel (csdgen decodes to [-1, 1]). The patch of token
  ``(r, c)`` of a ``rows x cols`` grid is the ``r``-th of ``rows`` and ``c``-th of ``cols``
  equal bins of the image (``adaptive_avg_pool2d`` bins when the sizes do not divide).
* **quartiles** of texture and of entropy are pooled over all tokens of all images added:
  average ranks (ties share a rank) put token ``k`` of ``n`` in quartile
  ``min(3, floor(4 (rank_k - 1) / n))``, so tied tokens share a quartile;
* per quartile, the share of tokens of each :class:`csdgen.Decision` (sampled, accepted,
  relaxed, resampled);
* the **Spearman rank correlation** of entropy with texture (Pearson correlation of average
  ranks): pooled over all tokens, and the mean over images of the within-image correlation
  (images whose texture or entropy is constant are left out of that mean).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from csdgen.decisions import Decision

__all__ = ["token_texture", "average_ranks", "spearman", "SpeedSources", "SpeedSourceSummary"]

_DECISIONS = [d.name.lower() for d in sorted(Decision)]


def token_texture(images: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Local texture under each image token: mean gradient magnitude of its patch.

    Args:
        images: ``[3, H, W]`` or ``[B, 3, H, W]`` float decoded image(s) (any channel count works).
        grid: ``(rows, cols)`` of the token grid, raster order; ``rows <= H``, ``cols <= W``.

    Returns:
        ``[N]`` or ``[B, N]`` float32, ``N = rows * cols``, in image units per pixel.

    Raises:
        ValueError: images not 3-D/4-D, or a grid finer than the image.
    """
    if images.dim() not in (3, 4):
        raise ValueError(f"images must be [3, H, W] or [B, 3, H, W], got shape {tuple(images.shape)}")
    single = images.dim() == 3
    x = images[None] if single else images
    rows, cols = int(grid[0]), int(grid[1])
    if not (1 <= rows <= x.shape[-2] and 1 <= cols <= x.shape[-1]):
        raise ValueError(f"grid {tuple(grid)} does not fit an image of {x.shape[-2]} x {x.shape[-1]} pixels")
    x = x.float()
    padded = F.pad(x, (0, 1, 0, 1), mode="replicate")
    dx = padded[..., :-1, 1:] - x
    dy = padded[..., 1:, :-1] - x
    magnitude = (dx.square() + dy.square()).sum(dim=1, keepdim=True).sqrt()  # [B, 1, H, W]
    texture = F.adaptive_avg_pool2d(magnitude, (rows, cols)).flatten(1)  # [B, N]
    return texture[0] if single else texture


def average_ranks(values: torch.Tensor) -> torch.Tensor:
    """Ranks ``1..N`` of each row, ties sharing their average rank (as ``scipy.stats.rankdata``).

    Args:
        values: ``[M, N]`` real tensor.

    Returns:
        ``[M, N]`` float64 ranks.
    """
    M, N = values.shape
    order = values.argsort(dim=1, stable=True)
    ordered = values.gather(1, order)
    starts = torch.ones_like(ordered, dtype=torch.bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    group = starts.flatten().cumsum(0) - 1  # a tie group id, unique over all rows
    positions = torch.arange(1, N + 1, dtype=torch.float64).repeat(M)
    groups = int(group[-1]) + 1 if group.numel() else 0
    sums = torch.zeros(groups, dtype=torch.float64).index_add_(0, group, positions)
    counts = torch.zeros(groups, dtype=torch.float64).index_add_(0, group, torch.ones_like(positions))
    ranks = torch.empty(M, N, dtype=torch.float64)
    ranks.scatter_(1, order, (sums / counts)[group].view(M, N))
    return ranks


def spearman(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spearman rank correlation of each row of ``a`` with the same row of ``b``.

    Args:
        a, b: ``[M, N]`` (or ``[N]``) real tensors.

    Returns:
        ``[M]`` (or ``[]``) float64 in [-1, 1]; NaN for a row where either is constant.
    """
    single = a.dim() == 1
    ra, rb = average_ranks(a.reshape(-1, a.shape[-1])), average_ranks(b.reshape(-1, b.shape[-1]))
    ra, rb = ra - ra.mean(1, keepdim=True), rb - rb.mean(1, keepdim=True)
    denominator = (ra.square().sum(1) * rb.square().sum(1)).sqrt()
    rho = torch.where(denominator > 0, (ra * rb).sum(1) / denominator.clamp_min(1e-300), torch.nan)
    return rho[0] if single else rho


def _quartiles(values: torch.Tensor) -> torch.Tensor:
    """``[n]`` -> ``[n]`` int64 quartile 0..3 of each value (pooled average ranks)."""
    n = values.numel()
    ranks = average_ranks(values.reshape(1, -1))[0]
    return ((ranks - 1) * 4 / n).floor().long().clamp(0, 3)


@dataclass
class SpeedSourceSummary:
    """Decisions by quartile of texture and of entropy over a set of images.

    Attributes:
        num_images: images added.
        num_tokens: tokens over all images.
        by_texture: ``[4, 4]`` int64 token counts, quartile of texture (0 smoothest) x
            :class:`~csdgen.Decision` code.
        by_entropy: ``[4, 4]`` int64 token counts, quartile of target entropy (0 lowest) x decision.
        texture_by_texture, entropy_by_texture: ``[4]`` mean texture / entropy (nats) per texture quartile.
        texture_by_entropy, entropy_by_entropy: ``[4]`` the same per entropy quartile.
        spearman_pooled: rank correlation of entropy with texture over all tokens.
        spearman_within_image: mean over images of the within-image rank correlation (NaN if no
            image has both non-constant).
    """

    num_images: int
    num_tokens: int
    by_texture: torch.Tensor
    by_entropy: torch.Tensor
    texture_by_texture: torch.Tensor
    entropy_by_texture: torch.Tensor
    texture_by_entropy: torch.Tensor
    entropy_by_entropy: torch.Tensor
    spearman_pooled: float
    spearman_within_image: float

    def shares(self, by: str) -> torch.Tensor:
        """``[4, 4]`` float64 share of each decision within each quartile (rows sum to 1; empty rows 0).

        Args:
            by: ``"texture"`` or ``"entropy"``.
        """
        if by not in ("texture", "entropy"):
            raise ValueError(f"by must be 'texture' or 'entropy', got {by!r}")
        counts = (self.by_texture if by == "texture" else self.by_entropy).double()
        return counts / counts.sum(1, keepdim=True).clamp_min(1)

    def rows(self) -> list[dict]:
        """Eight table rows (quartiles of texture, then of entropy) of plain Python numbers:
        ``by, quartile (1..4), tokens, mean_texture, mean_entropy_nats`` and the share of each decision."""
        rows = []
        for by in ("texture", "entropy"):
            counts = self.by_texture if by == "texture" else self.by_entropy
            textures = self.texture_by_texture if by == "texture" else self.texture_by_entropy
            entropies = self.entropy_by_texture if by == "texture" else self.entropy_by_entropy
            shares = self.shares(by)
            for q in range(4):
                rows.append({"by": by, "quartile": q + 1, "tokens": int(counts[q].sum()),
                             "mean_texture": float(textures[q]), "mean_entropy_nats": float(entropies[q]),
                             **{name: float(shares[q, d]) for d, name in enumerate(_DECISIONS)}})
        return rows


class SpeedSources:
    """Accumulates per-token decisions, entropies and textures over many images.

    Add images one by one or in batches with :meth:`add`, then call :meth:`summary`. Memory:
    three numbers per token (about 9 bytes), e.g. 100 MB for 5000 images of 48 x 48 tokens.
    """

    def __init__(self) -> None:
        self._decisions: list[torch.Tensor] = []
        self._entropy: list[torch.Tensor] = []
        self._texture: list[torch.Tensor] = []

    def add(self, decisions: torch.Tensor, entropy: torch.Tensor, images: torch.Tensor, grid: tuple[int, int]) -> None:
        """Add one image (``[N]``, ``[N]``, ``[3, H, W]``) or a batch (``[B, N]``, ``[B, N]``, ``[B, 3, H, W]``).

        Args:
            decisions: int :class:`~csdgen.Decision` codes (0 sampled, 1 accepted, 2 relaxed, 3 resampled), raster order.
            entropy: float target entropy per token, nats.
            images: the decoded image(s), float.
            grid: ``(rows, cols)``, ``rows * cols == N``.

        Raises:
            ValueError: shapes that do not match each other or the grid, or codes outside 0..3.
        """
        texture = token_texture(images, grid)
        texture = texture[None] if texture.dim() == 1 else texture
        decisions = decisions.reshape(-1, decisions.shape[-1]) if decisions.dim() else decisions
        entropy = entropy.reshape(-1, entropy.shape[-1]) if entropy.dim() else entropy
        if decisions.shape != texture.shape or entropy.shape != texture.shape:
            raise ValueError(f"decisions {tuple(decisions.shape)} and entropy {tuple(entropy.shape)} must both be "
                             f"{tuple(texture.shape)} ([B, rows * cols] for grid {tuple(grid)})")
        codes = decisions.detach().to("cpu", torch.int8)
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 3):
            raise ValueError(f"decision codes must be 0..3 (csdgen.Decision), got {int(codes.min())}..{int(codes.max())}")
        self._decisions.append(codes)
        self._entropy.append(entropy.detach().to("cpu", torch.float32))
        self._texture.append(texture.detach().cpu())

    @property
    def num_images(self) -> int:
        return sum(len(t) for t in self._texture)

    def summary(self) -> SpeedSourceSummary:
        """Quartile tables and rank correlations of everything added (see the module docstring).

        Raises:
            ValueError: nothing was added.
        """
        if not self._texture:
            raise ValueError("no images were added: call add() first")
        decisions = torch.cat([d.flatten() for d in self._decisions]).long()
        entropy = torch.cat([e.flatten() for e in self._entropy]).double()
        texture = torch.cat([t.flatten() for t in self._texture]).double()
        tables, means = {}, {}
        for by, values in (("texture", texture), ("entropy", entropy)):
            quartile = _quartiles(values)
            tables[by] = torch.zeros(16, dtype=torch.int64).index_add_(0, quartile * 4 + decisions, torch.ones_like(decisions)).view(4, 4)
            count = torch.zeros(4, dtype=torch.float64).index_add_(0, quartile, torch.ones_like(values)).clamp_min(1)
            means[by] = [torch.zeros(4, dtype=torch.float64).index_add_(0, quartile, v) / count for v in (texture, entropy)]
        within = [spearman(e.double(), t.double()) for e, t in zip(self._entropy, self._texture)]
        within_all = torch.cat(within)
        finite = within_all[~within_all.isnan()]
        return SpeedSourceSummary(
            num_images=self.num_images, num_tokens=int(decisions.numel()),
            by_texture=tables["texture"], by_entropy=tables["entropy"],
            texture_by_texture=means["texture"][0], entropy_by_texture=means["texture"][1],
            texture_by_entropy=means["entropy"][0], entropy_by_entropy=means["entropy"][1],
            spearman_pooled=float(spearman(entropy, texture)),
            spearman_within_image=float(finite.mean()) if finite.numel() else float("nan"),
        )
