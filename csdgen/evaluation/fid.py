"""FID: Frechet distance of Inception-v3 pool features, weights from a local file.

``FID = |mu_r - mu_g|^2 + Tr(S_r + S_g - 2 (S_r S_g)^(1/2))`` over the 2048-d pool features
of the FID Inception-v3 network (Heusel et al., "GANs trained by a two time-scale update
rule", 2017). The statistics and the distance are torchmetrics' ``FrechetInceptionDistance``
(``feature=`` a module, float64 sums); the network is :class:`InceptionFeatures`.

Why a network here: the FID Inception-v3 ships in torch-fidelity, pytorch-fid and clean-fid,
and all three require torchvision (torch-fidelity 0.4.0 declares it and imports it on
``import torch_fidelity``), which csdgen does not install. :class:`InceptionFeatures` is the
same network as torch-fidelity's ``FeatureExtractorInceptionV3`` (the TensorFlow FID graph of
2015-12-05: TensorFlow 1.x bilinear resize to 299 x 299 without half-pixel centres, inputs
``(x - 128) / 128``, batch norm eps 0.001, average pools that do not count padding, a max
pool in the last block's pool branch), with the same parameter names, so it loads the file
torch-fidelity and torchmetrics download, ``weights-inception-2015-12-05-6726825d.pth``
(see :data:`INCEPTION_URL`; pytorch-fid's ``pt_inception-2015-12-05-6726825d.pth`` has the
same layout). Checked once against torch-fidelity 0.4.0's class (its module file run on
its own, torchvision-free): it loads a random state dict saved by :class:`InceptionFeatures`
strictly, and the 2048-d features of 3 random 37 x 53 images agree to 6e-8. Values are comparable with torchmetrics' / torch-fidelity's FID on the same
images; clean-fid resizes differently and gives other values.

Reference statistics of a folder are computed once and cached in a ``.safetensors`` file
keyed by the folder's file names, sizes and modification times and the weights file, so a
resumed benchmark does not recompute them. Missing weights raise a one-line
``FileNotFoundError`` naming the file to download and the option to point at it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

__all__ = ["INCEPTION_FILE", "INCEPTION_URL", "IMAGE_SUFFIXES", "InceptionFeatures", "check_inception_path", "load_inception",
           "resize_bilinear_tf1", "image_files", "FidScorer"]

#: File name of the FID Inception-v3 weights in torch-fidelity's release.
INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"
#: Where torch-fidelity publishes that file (torchmetrics' FID downloads it from there).
INCEPTION_URL = f"https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/{INCEPTION_FILE}"
#: Image files read from a reference folder.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def resize_bilinear_tf1(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bilinear resize as TensorFlow 1.x ``resize_bilinear(align_corners=False)``: output pixel
    ``o`` samples input coordinate ``o * in / out`` (no half-pixel offset), clamped at the border.

    Args:
        x: ``[B, C, H, W]`` float.
        size: ``(H', W')``.

    Returns:
        ``[B, C, H', W']`` in ``x``'s dtype.
    """
    def axis(n_in: int, n_out: int):
        coordinate = torch.arange(n_out, dtype=torch.float64, device=x.device) * (n_in / n_out)
        lo = coordinate.floor().long().clamp_max(n_in - 1)
        return lo, (lo + 1).clamp_max(n_in - 1), (coordinate - lo).to(x.dtype)

    y_lo, y_hi, fy = axis(x.shape[-2], size[0])
    x_lo, x_hi, fx = axis(x.shape[-1], size[1])
    rows = x[..., y_lo, :] + (x[..., y_hi, :] - x[..., y_lo, :]) * fy[:, None]
    return rows[..., x_lo] + (rows[..., x_hi] - rows[..., x_lo]) * fx


class _ConvBN(nn.Module):
    """Convolution without bias, batch norm (eps 0.001), ReLU; parameters ``conv.*``, ``bn.*``."""

    def __init__(self, cin: int, cout: int, kernel, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def _avg3(x):
    return F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)


class _MixedA(nn.Module):  # 35 x 35: 1x1 | 1x1-5x5 | 1x1-3x3-3x3 | avg-1x1
    def __init__(self, cin: int, pool: int):
        super().__init__()
        self.branch1x1 = _ConvBN(cin, 64, 1)
        self.branch5x5_1, self.branch5x5_2 = _ConvBN(cin, 48, 1), _ConvBN(48, 64, 5, padding=2)
        self.branch3x3dbl_1 = _ConvBN(cin, 64, 1)
        self.branch3x3dbl_2, self.branch3x3dbl_3 = _ConvBN(64, 96, 3, padding=1), _ConvBN(96, 96, 3, padding=1)
        self.branch_pool = _ConvBN(cin, pool, 1)

    def forward(self, x):
        return torch.cat([self.branch1x1(x), self.branch5x5_2(self.branch5x5_1(x)),
                          self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
                          self.branch_pool(_avg3(x))], 1)


class _MixedB(nn.Module):  # 35 -> 17: 3x3/2 | 1x1-3x3-3x3/2 | max/2
    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3 = _ConvBN(cin, 384, 3, stride=2)
        self.branch3x3dbl_1 = _ConvBN(cin, 64, 1)
        self.branch3x3dbl_2, self.branch3x3dbl_3 = _ConvBN(64, 96, 3, padding=1), _ConvBN(96, 96, 3, stride=2)

    def forward(self, x):
        return torch.cat([self.branch3x3(x), self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
                          F.max_pool2d(x, 3, stride=2)], 1)


class _MixedC(nn.Module):  # 17 x 17, factorised 7x7: 1x1 | 1x7-7x1 | 7x1-1x7-7x1-1x7 | avg-1x1
    def __init__(self, cin: int, c7: int):
        super().__init__()
        row, col = dict(kernel=(1, 7), padding=(0, 3)), dict(kernel=(7, 1), padding=(3, 0))
        self.branch1x1 = _ConvBN(cin, 192, 1)
        self.branch7x7_1, self.branch7x7_2, self.branch7x7_3 = _ConvBN(cin, c7, 1), _ConvBN(c7, c7, **row), _ConvBN(c7, 192, **col)
        self.branch7x7dbl_1 = _ConvBN(cin, c7, 1)
        self.branch7x7dbl_2, self.branch7x7dbl_3 = _ConvBN(c7, c7, **col), _ConvBN(c7, c7, **row)
        self.branch7x7dbl_4, self.branch7x7dbl_5 = _ConvBN(c7, c7, **col), _ConvBN(c7, 192, **row)
        self.branch_pool = _ConvBN(cin, 192, 1)

    def forward(self, x):
        double = x
        for i in range(1, 6):
            double = getattr(self, f"branch7x7dbl_{i}")(double)
        return torch.cat([self.branch1x1(x), self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x))), double,
                          self.branch_pool(_avg3(x))], 1)


class _MixedD(nn.Module):  # 17 -> 8: 1x1-3x3/2 | 1x1-1x7-7x1-3x3/2 | max/2
    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3_1, self.branch3x3_2 = _ConvBN(cin, 192, 1), _ConvBN(192, 320, 3, stride=2)
        self.branch7x7x3_1 = _ConvBN(cin, 192, 1)
        self.branch7x7x3_2 = _ConvBN(192, 192, (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = _ConvBN(192, 192, (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = _ConvBN(192, 192, 3, stride=2)

    def forward(self, x):
        tower = self.branch7x7x3_4(self.branch7x7x3_3(self.branch7x7x3_2(self.branch7x7x3_1(x))))
        return torch.cat([self.branch3x3_2(self.branch3x3_1(x)), tower, F.max_pool2d(x, 3, stride=2)], 1)


class _MixedE(nn.Module):  # 8 x 8, split 3x3: 1x1 | 1x1-(1x3, 3x1) | 1x1-3x3-(1x3, 3x1) | pool-1x1
    def __init__(self, cin: int, max_pool: bool):
        super().__init__()
        row, col = dict(kernel=(1, 3), padding=(0, 1)), dict(kernel=(3, 1), padding=(1, 0))
        self.max_pool = max_pool
        self.branch1x1 = _ConvBN(cin, 320, 1)
        self.branch3x3_1, self.branch3x3_2a, self.branch3x3_2b = _ConvBN(cin, 384, 1), _ConvBN(384, 384, **row), _ConvBN(384, 384, **col)
        self.branch3x3dbl_1, self.branch3x3dbl_2 = _ConvBN(cin, 448, 1), _ConvBN(448, 384, 3, padding=1)
        self.branch3x3dbl_3a, self.branch3x3dbl_3b = _ConvBN(384, 384, **row), _ConvBN(384, 384, **col)
        self.branch_pool = _ConvBN(cin, 192, 1)

    def forward(self, x):
        a = self.branch3x3_1(x)
        b = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        pooled = F.max_pool2d(x, 3, stride=1, padding=1) if self.max_pool else _avg3(x)
        return torch.cat([self.branch1x1(x), self.branch3x3_2a(a), self.branch3x3_2b(a),
                          self.branch3x3dbl_3a(b), self.branch3x3dbl_3b(b), self.branch_pool(pooled)], 1)


class InceptionFeatures(nn.Module):
    """The FID Inception-v3 up to its 2048-d average pool (random weights until loaded).

    ``forward``: ``[B, 3, H, W]`` uint8 (0..255, any size) -> ``[B, 2048]`` float32 features.
    ``num_features`` (2048) tells torchmetrics the feature size.
    """

    num_features = 2048
    size = 299

    def __init__(self):
        super().__init__()
        self.Conv2d_1a_3x3 = _ConvBN(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = _ConvBN(32, 32, 3)
        self.Conv2d_2b_3x3 = _ConvBN(32, 64, 3, padding=1)
        self.Conv2d_3b_1x1 = _ConvBN(64, 80, 1)
        self.Conv2d_4a_3x3 = _ConvBN(80, 192, 3)
        self.Mixed_5b, self.Mixed_5c, self.Mixed_5d = _MixedA(192, 32), _MixedA(256, 64), _MixedA(288, 64)
        self.Mixed_6a = _MixedB(288)
        self.Mixed_6b, self.Mixed_6c = _MixedC(768, 128), _MixedC(768, 160)
        self.Mixed_6d, self.Mixed_6e = _MixedC(768, 160), _MixedC(768, 192)
        self.Mixed_7a = _MixedD(768)
        self.Mixed_7b, self.Mixed_7c = _MixedE(1280, max_pool=False), _MixedE(2048, max_pool=True)
        self.requires_grad_(False)
        self.eval()

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` uint8 -> ``[B, 3, 299, 299]`` float network input in [-1, 1).

        Raises:
            ValueError: not a uint8 ``[B, 3, H, W]`` tensor.
        """
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"FID images must be a uint8 tensor [B, 3, H, W] (0..255), got {images.dtype} {tuple(images.shape)}")
        dtype = self.Conv2d_1a_3x3.conv.weight.dtype
        x = resize_bilinear_tf1(images.to(self.Conv2d_1a_3x3.conv.weight.device, dtype), (self.size, self.size))
        return (x - 128) / 128

    def network(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, 3, 299, 299]`` preprocessed input -> ``[B, 2048]`` float32 pool features."""
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = F.max_pool2d(x, 3, stride=2)
        x = F.max_pool2d(self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x)), 3, stride=2)
        for name in ("5b", "5c", "5d", "6a", "6b", "6c", "6d", "6e", "7a", "7b", "7c"):
            x = getattr(self, f"Mixed_{name}")(x)
        return x.mean(dim=(2, 3)).float()

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.network(self.preprocess(images))


def check_inception_path(path: str | os.PathLike, *, option: str = "--inception-weights") -> None:
    """Refuse a weights path that is no file, without reading it (a command checks this before its own model loads).

    Raises:
        FileNotFoundError: one line: what to download and which option to set.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"FID Inception weights not found at {path} (csdgen never downloads): on a machine with "
                                f"internet fetch {INCEPTION_URL}, copy it here and pass {option} FILE")


def load_inception(path: str | os.PathLike, *, option: str = "--inception-weights") -> InceptionFeatures:
    """The FID Inception-v3 with weights from a local file (``.pth`` state dict or ``.safetensors``).

    Keys the network does not use (the 1008-way ``fc`` classifier) are ignored.

    Args:
        path: the weights file (torch-fidelity's :data:`INCEPTION_FILE` or the same layout).
        option: the command-line option that names the file, quoted in the error message.

    Raises:
        FileNotFoundError: no such file (one line: what to download, which option to set).
        ValueError: the file is not an FID Inception-v3 state dict (one line).
    """
    path = Path(path).expanduser()
    check_inception_path(path, option=option)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            state = load_file(str(path))
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file gets the same one-line error
        reason = f"{type(error).__name__}: {str(error).splitlines()[0]}" if str(error) else type(error).__name__
        kind = "a .safetensors file" if path.suffix == ".safetensors" else "a torch .pth file (torch.load)"
        raise ValueError(f"cannot read FID Inception weights {path}: not readable as {kind} ({reason[:200]}); "
                         f"{option} takes torch-fidelity's {INCEPTION_FILE}") from None
    model = InceptionFeatures()
    expected = model.state_dict()
    if not isinstance(state, dict):
        raise ValueError(f"{path} is not a state dict (got {type(state).__name__}); {option} takes torch-fidelity's {INCEPTION_FILE}")
    needed = [k for k in expected if not k.endswith("num_batches_tracked")]
    missing = [k for k in needed if k not in state]
    wrong = [k for k in needed if k in state and tuple(state[k].shape) != tuple(expected[k].shape)]
    if missing or wrong:
        example = (missing or wrong)[0]
        raise ValueError(f"{path} is not an FID Inception-v3 state dict: {len(missing)} keys missing, {len(wrong)} of another "
                         f"shape (e.g. {example!r}); {option} takes torch-fidelity's {INCEPTION_FILE}")
    model.load_state_dict({k: state[k] for k in needed}, strict=False)
    return model


def image_files(folder: str | os.PathLike, at_least: int = 1) -> list[Path]:
    """Image files (:data:`IMAGE_SUFFIXES`, any case) directly in ``folder``, sorted by name.

    Raises:
        FileNotFoundError: no such folder, or no image in it (one line).
        ValueError: fewer than ``at_least`` images (a reference set needs 2 for its covariance), naming
            the folder and the count.
    """
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"reference image folder {folder} does not exist (FID needs real images, e.g. COCO val2017)")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise FileNotFoundError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in the reference folder {folder}")
    if len(files) < at_least:
        raise ValueError(f"the reference folder {folder} holds {len(files)} image{'s' * (len(files) != 1)}; FID needs at "
                         f"least {at_least} (the covariance of their features; papers use thousands)")
    return files


def _read_uint8(path: Path) -> torch.Tensor:
    with Image.open(path) as image:
        return torch.from_numpy(np.asarray(image.convert("RGB")).copy()).permute(2, 0, 1)


class _Precomputed(nn.Module):
    """Identity "feature extractor": torchmetrics' FID accumulates features computed beforehand."""

    num_features = InceptionFeatures.num_features

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features


class FidScorer:
    """FID of image sets against a folder of reference images.

    Args:
        weights: the FID Inception-v3 weights file (see :func:`load_inception`).
        reference: a folder of real images (e.g. COCO val2017), read once.
        device: where the network runs.
        batch_size: images per forward.
        cache: a ``.safetensors`` file for the reference statistics (created if absent or
            stale; None: no cache).
        option: command-line option naming the weights, quoted in errors.

    Raises:
        FileNotFoundError: missing weights or reference images (one line each).
        ValueError: unreadable weights file.
    """

    def __init__(self, weights: str | os.PathLike, reference: str | os.PathLike, *, device: str | torch.device = "cpu",
                 batch_size: int = 32, cache: str | os.PathLike | None = None, option: str = "--inception-weights"):
        from torchmetrics.image.fid import FrechetInceptionDistance

        self.weights = Path(weights).expanduser()
        self.extractor = load_inception(self.weights, option=option).to(device)
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        self.reference = Path(reference).expanduser()
        self._metric_class = FrechetInceptionDistance
        self.reference_states = self._reference_states(image_files(self.reference, at_least=2),
                                                       None if cache is None else Path(cache))

    def features(self, images: torch.Tensor | Iterable[torch.Tensor]) -> torch.Tensor:
        """Pool features of a uint8 batch ``[B, 3, H, W]`` or of uint8 images ``[3, H_i, W_i]`` of any sizes.

        Returns:
            ``[B, 2048]`` float32 on the CPU.
        """
        if isinstance(images, torch.Tensor) and (images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3):
            # the whole batch's shape, not the one image the network's own check would quote
            raise ValueError(f"FID images must be a uint8 tensor [B, 3, H, W] (0..255), got {images.dtype} {tuple(images.shape)}")
        batch = list(images) if not isinstance(images, torch.Tensor) else images
        out = []
        for start in range(0, len(batch), self.batch_size):
            chunk = batch[start : start + self.batch_size]
            inputs = torch.cat([self.extractor.preprocess(image[None]) for image in chunk])
            with torch.no_grad():
                out.append(self.extractor.network(inputs).cpu())
        return torch.cat(out) if out else torch.zeros(0, InceptionFeatures.num_features)

    @staticmethod
    def _states(features: torch.Tensor) -> dict[str, torch.Tensor]:
        f = features.double()
        return {"features_sum": f.sum(0), "features_cov_sum": f.t().mm(f), "features_num_samples": torch.tensor(len(f))}

    def _reference_states(self, files: list[Path], cache: Path | None) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        listing = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]
        weights_stat = self.weights.stat()
        key = hashlib.sha256(json.dumps([listing, [self.weights.name, weights_stat.st_size, weights_stat.st_mtime_ns]]).encode()).hexdigest()
        if cache is not None and cache.is_file():
            try:
                stored = load_file(str(cache))
                if bytes(stored.pop("key").tolist()).decode() == key:
                    return stored
            except Exception:  # noqa: BLE001 - a damaged or foreign cache is recomputed
                pass
        features = torch.cat([self.features([_read_uint8(p) for p in files[i : i + self.batch_size]])
                              for i in range(0, len(files), self.batch_size)])
        states = self._states(features)
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            from csdgen.atomic import save_safetensors

            save_safetensors({**states, "key": torch.tensor(list(key.encode()), dtype=torch.uint8)}, cache)
        return states

    def fid(self, images: torch.Tensor | Iterable[torch.Tensor] | str | os.PathLike) -> float:
        """FID of a set of generated images against the reference folder.

        Args:
            images: a uint8 batch ``[M, 3, H, W]``, uint8 images ``[3, H_i, W_i]``, or a folder of image files; M >= 2.

        Returns:
            FID (>= 0 up to rounding). Few images bias it upwards: compare methods at equal M.

        Raises:
            ValueError: fewer than 2 images.
        """
        if isinstance(images, (str, os.PathLike)):
            images = [_read_uint8(p) for p in image_files(images)]
        features = self.features(images)
        if len(features) < 2:
            raise ValueError(f"FID needs at least 2 generated images, got {len(features)}")
        metric = self._metric_class(feature=_Precomputed(), reset_real_features=False)
        for name, value in self.reference_states.items():  # the real side's sums, in torchmetrics' state layout
            setattr(metric, f"real_{name}", value.clone())
        metric.update(features, real=False)
        return float(metric.compute())
