"""bfloat16 on the test device: engines and batch sizes agree in logits within bfloat16's tolerance,
and bfloat16 runs draw from float32's distribution; never token for token (a bfloat16 rounding tips
a draw early and the image goes its own way: 21-32 % of tokens equal across engines).

Marked ``device``: ``CSDGEN_TEST_DEVICE=cuda python -m pytest -m device`` runs them on a GPU.
"""

import pytest
import torch

import csdgen
from conftest import on_device
from csdgen import SamplingConfig
from csdgen.evaluation.agreement import histogram_distance, teacher_forced_logits

pytestmark = pytest.mark.device

SAMPLED = SamplingConfig(guidance_scale=3.0, temperature=1.0)
CLASSES = [0, 1, 2, 3, 4, 0, 1, 2]
#: bfloat16 keeps 8 significant bits: logits of size ~2 are spaced 2**-6; a few roundings apart
TOLERANCE = dict(atol=0.05, rtol=0.02)


@pytest.fixture(scope="module")
def bf16_model(cached_model, test_device):
    return on_device(cached_model, test_device, torch.bfloat16)


@pytest.fixture(scope="module")
def fed_tokens(bf16_model):
    """Tokens of a bfloat16 SJD run (eager engine), fed to every side of the comparisons."""
    return csdgen.generate(bf16_model, CLASSES, method="sjd", window=8, sampling=SAMPLED, seed=0, engine="eager").tokens


def _assert_close(a, b):
    for x, y in zip(a, b):
        torch.testing.assert_close(x.float(), y.float(), **TOLERANCE)


def test_bfloat16_static_and_eager_logits_agree_within_tolerance(bf16_model, fed_tokens, cached_model, test_device):
    eager = teacher_forced_logits(bf16_model, CLASSES, fed_tokens, guided=True, engine="eager", window=8)
    static = teacher_forced_logits(bf16_model, CLASSES, fed_tokens, guided=True, engine="static", window=8)
    assert eager[0].dtype == torch.bfloat16
    _assert_close(eager, static)
    float32 = teacher_forced_logits(on_device(cached_model, test_device), CLASSES, fed_tokens, guided=True, window=8)
    _assert_close(eager, float32)  # and both are float32's logits, within bfloat16's rounding


def test_bfloat16_row_logits_do_not_depend_on_the_batch(bf16_model, fed_tokens):
    batch = teacher_forced_logits(bf16_model, CLASSES, fed_tokens, guided=True, engine="static", window=8)
    for row in (0, 5):
        alone = teacher_forced_logits(bf16_model, CLASSES[row:row + 1], fed_tokens[row:row + 1], guided=True,
                                      engine="static", window=8)
        _assert_close([b[row] for b in batch], [a[0] for a in alone])


@pytest.mark.parametrize("method", ["sjd", "csd"])
def test_bfloat16_runs_draw_from_the_float32_distribution(bf16_model, cached_model, test_device, method):
    """Over three seeds: step compression within 10 % of float32's, and token histograms closer to
    float32's than float32's own at other seeds are (the control: another sample of the same law)."""
    float32_model = on_device(cached_model, test_device)
    kwargs = dict(method=method, window=8, sampling=SAMPLED)
    low = [csdgen.generate(bf16_model, CLASSES, seed=s, **kwargs) for s in range(3)]
    full = [csdgen.generate(float32_model, CLASSES, seed=s, **kwargs) for s in range(3)]
    control = [csdgen.generate(float32_model, CLASSES, seed=s + 10, **kwargs) for s in range(3)]

    def mean(runs):
        return sum(r.step_compression for r in runs) / len(runs)

    assert mean(low) > 1 and abs(mean(low) - mean(full)) <= 0.1 * mean(full), (mean(low), mean(full))

    def tokens(runs):
        return torch.cat([r.tokens.cpu() for r in runs])

    V = cached_model.codebook_size
    assert histogram_distance(tokens(low), tokens(full), V) < histogram_distance(tokens(control), tokens(full), V)
