"""FID with the FID Inception-v3 architecture and random weights saved to a temporary file.

The network is the real one (24 M parameters, the released key layout), so a weights file of
that layout is what the test loads. To keep the test fast on a CPU, the input resize is 75 x 75
(Inception-v3's smallest input) instead of 299 x 299: the same layers and code path on 16 times
fewer pixels.
"""

import numpy as np
import pytest
import torch
from PIL import Image

from csdgen.evaluation import fid as fid_module
from csdgen.evaluation.fid import INCEPTION_URL, FidScorer, InceptionFeatures, load_inception, resize_bilinear_tf1


@pytest.fixture(autouse=True)
def small_input(monkeypatch):
    monkeypatch.setattr(InceptionFeatures, "size", 75)


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """Random FID Inception-v3 weights with non-trivial batch-norm statistics, saved as torch-fidelity saves them."""
    torch.manual_seed(0)
    network = InceptionFeatures()
    for module in network.modules():  # He initialisation: features that vary with the image through 94 layers
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
    state = network.state_dict()
    g = torch.Generator().manual_seed(1)
    for key, value in state.items():
        if key.endswith("running_var"):
            state[key] = 0.5 + torch.rand(value.shape, generator=g)
        elif key.endswith("running_mean") or key.endswith("bn.bias"):
            state[key] = 0.1 * torch.randn(value.shape, generator=g)
    state["fc.weight"], state["fc.bias"] = torch.zeros(1008, 2048), torch.zeros(1008)  # in the released file, unused
    path = tmp_path_factory.mktemp("inception") / "weights-inception-2015-12-05-6726825d.pth"
    torch.save(state, path)
    return path


def _write_images(folder, seed, count=5, size=24, smooth=False):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        if smooth:  # colour ramps
            ramp = np.linspace(0, 1, size)[None, :, None] * rng.uniform(0, 255, (1, 1, 3))
            array = np.broadcast_to(ramp, (size, size, 3))
        else:  # coarse random blocks
            array = np.kron(rng.uniform(0, 255, (size // 4, size // 4, 3)), np.ones((4, 4, 1)))
        Image.fromarray(array.astype(np.uint8)).save(folder / f"{i:03d}.png")
    return folder


def test_tf1_resize_samples_without_half_pixel_offset():
    x = torch.tensor([[[[0.0, 10.0]]]])
    torch.testing.assert_close(resize_bilinear_tf1(x, (1, 4)), torch.tensor([[[[0.0, 5.0, 10.0, 10.0]]]]))
    y = torch.arange(16.0).view(1, 1, 4, 4)
    torch.testing.assert_close(resize_bilinear_tf1(y, (2, 2)), y[..., ::2, ::2])  # o * 2 lands on input pixels


def test_fid_of_a_set_against_itself_is_about_zero_and_other_sets_are_farther(tmp_path, weights):
    reference = _write_images(tmp_path / "real", seed=0)
    scorer = FidScorer(weights, reference, batch_size=3)
    same = scorer.fid(reference)
    other = scorer.fid(_write_images(tmp_path / "smooth", seed=1, smooth=True))
    print(f"FID same set {same:.3g}, other set {other:.3g}")
    assert abs(same) < 1e-3 * other and other > 0
    images = torch.stack([torch.from_numpy(np.array(Image.open(p))).permute(2, 0, 1) for p in sorted(reference.iterdir())])
    assert scorer.fid(images) == pytest.approx(same, abs=1e-3 * other)  # a uint8 batch scores like the folder


def test_safetensors_weights_load_like_the_pth_file(tmp_path, weights):
    from safetensors.torch import save_file

    state = torch.load(weights, weights_only=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "w.safetensors"))
    x = torch.randint(0, 256, (2, 3, 20, 30), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    a, b = load_inception(weights)(x), load_inception(tmp_path / "w.safetensors")(x)
    assert a.shape == (2, 2048) and a.dtype == torch.float32
    torch.testing.assert_close(a, b)


def test_reference_statistics_are_cached_and_recomputed_when_the_folder_changes(tmp_path, weights, monkeypatch):
    reference = _write_images(tmp_path / "real", seed=3, count=3)
    cache = tmp_path / "cache" / "reference.safetensors"
    first = FidScorer(weights, reference, cache=cache).reference_states
    assert cache.is_file()
    calls = []
    original = FidScorer.features
    monkeypatch.setattr(FidScorer, "features", lambda self, images: calls.append(1) or original(self, images))
    again = FidScorer(weights, reference, cache=cache).reference_states
    assert not calls and all(torch.equal(first[k], again[k]) for k in first)
    _write_images(tmp_path / "more", seed=4, count=1)
    (tmp_path / "more" / "000.png").rename(reference / "999.png")
    changed = FidScorer(weights, reference, cache=cache).reference_states
    assert calls and int(changed["features_num_samples"]) == 4


def test_missing_or_wrong_inputs_are_one_line_errors(tmp_path, weights):
    with pytest.raises(FileNotFoundError) as info:
        FidScorer(tmp_path / "nothing.pth", tmp_path)
    assert INCEPTION_URL in str(info.value) and "--inception-weights FILE" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(FileNotFoundError, match="--inception FILE"):
        load_inception(tmp_path / "nothing.pth", option="--inception")
    torch.save({"conv.weight": torch.zeros(1)}, tmp_path / "other.pth")
    with pytest.raises(ValueError, match=r"is not an FID Inception-v3 state dict: \d+ keys missing"):
        load_inception(tmp_path / "other.pth")
    (tmp_path / "junk.pth").write_text("not a checkpoint\nsecond line")
    with pytest.raises(ValueError) as info:
        load_inception(tmp_path / "junk.pth")
    assert "cannot read FID Inception weights" in str(info.value) and "\n" not in str(info.value)
    # a text file: what the file should be, not torch's bare "KeyError: 101" alone
    assert "not readable as a torch .pth file" in str(info.value) and "weights-inception-2015-12-05" in str(info.value)
    with pytest.raises(FileNotFoundError, match="reference image folder .* does not exist"):
        FidScorer(weights, tmp_path / "no-such-folder")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no images"):
        FidScorer(weights, tmp_path / "empty")
    with pytest.raises(ValueError, match=r"reference folder .*one holds 1 image; FID needs at least 2"):
        FidScorer(weights, _write_images(tmp_path / "one", seed=5, count=1))
    scorer = FidScorer(weights, _write_images(tmp_path / "real", seed=5, count=2))
    with pytest.raises(ValueError, match="at least 2 generated images, got 1"):
        scorer.fid(torch.zeros(1, 3, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"uint8 tensor \[B, 3, H, W\]"):
        scorer.fid(torch.zeros(2, 3, 8, 8))
    assert fid_module.IMAGE_SUFFIXES  # the reference reader's file types are public


def test_a_file_that_is_no_inception_state_dict_names_the_option_and_the_file_it_takes(tmp_path):
    """A CLIP checkpoint passed as --inception-weights got "... is not an FID Inception-v3 state dict: 470 keys
    missing" without saying which option was wrong or what it takes (new-user try-out)."""
    torch.save({"conv.weight": torch.zeros(1)}, tmp_path / "other.pth")
    torch.save([1, 2], tmp_path / "list.pth")
    for name in ("other.pth", "list.pth"):
        with pytest.raises(ValueError) as info:
            load_inception(tmp_path / name, option="--inception-weights")
        message = str(info.value)
        assert "--inception-weights takes torch-fidelity's weights-inception-2015-12-05-6726825d.pth" in message
        assert "\n" not in message


def test_a_float_batch_is_refused_quoting_the_batch_shape_given(tmp_path, weights):
    """FidScorer.fid of a float [2, 3, 8, 8] batch said "got torch.float32 (1, 3, 8, 8)": the shape of one
    image, not of what the caller passed (new-user try-out)."""
    scorer = FidScorer(weights, _write_images(tmp_path / "real", 0))
    with pytest.raises(ValueError) as info:
        scorer.fid(torch.zeros(2, 3, 8, 8))
    assert "uint8 tensor [B, 3, H, W]" in str(info.value) and "torch.float32 (2, 3, 8, 8)" in str(info.value)

