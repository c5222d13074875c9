"""Where the speed comes from: texture per token, ranks, quartile tables, on images with known answers."""

import math

import pytest
import torch
from scipy import stats

from csdgen.decoding import Decision
from csdgen.evaluation.texture import SpeedSources, average_ranks, spearman, token_texture


def _naive_texture(image, rows, cols):
    """Per-pixel loops: the definition written out, for patches that divide the image."""
    C, H, W = image.shape
    ph, pw = H // rows, W // cols
    out = torch.zeros(rows * cols, dtype=torch.float64)
    x = image.double()
    for r in range(rows):
        for c in range(cols):
            total = 0.0
            for i in range(r * ph, (r + 1) * ph):
                for j in range(c * pw, (c + 1) * pw):
                    gx = x[:, i, min(j + 1, W - 1)] - x[:, i, j]
                    gy = x[:, min(i + 1, H - 1), j] - x[:, i, j]
                    total += float((gx.square() + gy.square()).sum().sqrt())
            out[r * cols + c] = total / (ph * pw)
    return out


def test_texture_of_a_ramp_is_known_exactly():
    # x[c, i, j] = a * j on every channel: forward difference a everywhere but the last column,
    # so |grad| = sqrt(3) a, and the last column of patches loses one column of pw.
    a, H, W, rows, cols = 0.05, 8, 12, 2, 3
    image = (a * torch.arange(W, dtype=torch.float32)).expand(3, H, W).clone()
    texture = token_texture(image, (rows, cols)).view(rows, cols)
    pw = W // cols
    expected = torch.full((rows, cols), math.sqrt(3) * a)
    expected[:, -1] *= (pw - 1) / pw
    torch.testing.assert_close(texture, expected)


def test_flat_patches_have_zero_texture_and_noise_the_most():
    image = torch.zeros(3, 16, 16)
    image[:, 8:, 8:] = torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(0))
    texture = token_texture(image, (2, 2))
    assert texture[0] == 0  # flat, and so are its right and lower neighbours
    assert texture[1] > 0 and texture[2] > 0  # flat, but their last row / column steps onto the noise
    assert texture[3] > 4 * max(texture[1], texture[2])


def test_texture_matches_the_per_pixel_definition_in_batches():
    images = torch.randn(2, 3, 12, 8, generator=torch.Generator().manual_seed(1))
    batch = token_texture(images, (3, 2))
    assert batch.shape == (2, 6)
    for b in range(2):
        torch.testing.assert_close(batch[b].double(), _naive_texture(images[b], 3, 2), rtol=1e-5, atol=1e-6)


def test_bad_grid_and_shape_are_one_line_errors():
    with pytest.raises(ValueError, match=r"grid \(20, 2\) does not fit an image of 16 x 16 pixels"):
        token_texture(torch.zeros(3, 16, 16), (20, 2))
    with pytest.raises(ValueError, match="images must be"):
        token_texture(torch.zeros(16, 16), (2, 2))
    sources = SpeedSources()
    with pytest.raises(ValueError, match="must both be"):
        sources.add(torch.zeros(5, dtype=torch.int8), torch.zeros(4), torch.zeros(3, 8, 8), (2, 2))
    with pytest.raises(ValueError, match="decision codes must be 0..3"):
        sources.add(torch.full((4,), 7, dtype=torch.int8), torch.zeros(4), torch.zeros(3, 8, 8), (2, 2))
    with pytest.raises(ValueError, match="no images were added"):
        sources.summary()


def test_ranks_and_spearman_equal_scipy_with_ties():
    g = torch.Generator().manual_seed(2)
    a = torch.randint(0, 6, (5, 40), generator=g).float()  # many ties
    b = a + torch.randint(0, 4, (5, 40), generator=g).float()
    for row in range(5):
        torch.testing.assert_close(average_ranks(a)[row], torch.from_numpy(stats.rankdata(a[row].numpy())).double())
        assert float(spearman(a[row], b[row])) == pytest.approx(stats.spearmanr(a[row], b[row]).statistic, abs=1e-12)
    torch.testing.assert_close(spearman(a, b), torch.tensor([stats.spearmanr(a[r], b[r]).statistic for r in range(5)],
                                                             dtype=torch.float64))
    assert spearman(torch.ones(6), torch.arange(6.0)).isnan()


def _textured_images(count, grid=(4, 4), patch=4, seed=3):
    """Images whose token patches are noise of a random amplitude per token."""
    g = torch.Generator().manual_seed(seed)
    rows, cols = grid
    amplitude = torch.rand(count, 1, rows, cols, generator=g)
    amplitude = amplitude.repeat_interleave(patch, 2).repeat_interleave(patch, 3)
    return amplitude * torch.randn(count, 3, rows * patch, cols * patch, generator=g)


def test_relaxation_on_the_smoothest_quarter_is_found_there():
    # Decisions follow the measured texture: the smoothest quarter relaxed, the next accepted,
    # then resampled, the most textured sampled. Entropy decreases with texture (the CSD premise).
    images = _textured_images(12)
    texture = token_texture(images, (4, 4))
    quartile_of_rank = (average_ranks(texture.reshape(1, -1))[0].view(12, 16) - 1).mul(4 / texture.numel()).floor().long()
    code = torch.tensor([int(Decision.RELAXED), int(Decision.ACCEPTED), int(Decision.RESAMPLED), int(Decision.SAMPLED)])
    decisions = code[quartile_of_rank].to(torch.int8)
    entropy = 5.0 - 2.0 * texture  # nats, strictly decreasing in texture
    sources = SpeedSources()
    sources.add(decisions[:5], entropy[:5], images[:5], (4, 4))  # a batch
    for i in range(5, 12):  # then image by image
        sources.add(decisions[i], entropy[i], images[i], (4, 4))
    summary = sources.summary()
    assert summary.num_images == 12 and summary.num_tokens == 12 * 16
    expected = torch.zeros(4, 4, dtype=torch.int64)
    for q in range(4):
        expected[q, code[q]] = 12 * 16 // 4
    assert torch.equal(summary.by_texture, expected)
    assert torch.equal(summary.by_entropy, expected.flip(0))  # lowest entropy = most textured
    torch.testing.assert_close(summary.shares("texture"), (expected > 0).double())
    assert summary.spearman_pooled == pytest.approx(-1.0)
    assert summary.spearman_within_image == pytest.approx(-1.0)
    assert torch.all(summary.texture_by_texture.diff() > 0) and torch.all(summary.entropy_by_texture.diff() < 0)
    torch.testing.assert_close(summary.entropy_by_texture, 5.0 - 2.0 * summary.texture_by_texture)
    rows = summary.rows()
    assert len(rows) == 8 and rows[0]["by"] == "texture" and rows[0]["relaxed"] == 1.0 and rows[4]["by"] == "entropy"
    assert rows[7]["relaxed"] == 1.0 and sum(r["tokens"] for r in rows[:4]) == 12 * 16


def test_pooled_and_within_image_correlations_differ_as_scipy_says():
    images = _textured_images(6, seed=4)
    texture = token_texture(images, (4, 4))
    g = torch.Generator().manual_seed(5)
    entropy = texture + 0.3 * torch.randn(texture.shape, generator=g) + torch.arange(6.0)[:, None]  # image offsets
    decisions = torch.zeros(6, 16, dtype=torch.int8)
    sources = SpeedSources()
    sources.add(decisions, entropy, images, (4, 4))
    summary = sources.summary()
    pooled = stats.spearmanr(entropy.flatten().double().numpy(), texture.flatten().double().numpy()).statistic
    within = sum(stats.spearmanr(entropy[i].double().numpy(), texture[i].double().numpy()).statistic for i in range(6)) / 6
    assert summary.spearman_pooled == pytest.approx(pooled, abs=1e-10)
    assert summary.spearman_within_image == pytest.approx(within, abs=1e-10)
    assert torch.equal(summary.by_texture[:, 0], torch.full((4,), 24))  # all sampled, 96 / 4 per quartile
