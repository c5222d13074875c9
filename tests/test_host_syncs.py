"""One host sync per decoding iteration, counted on the CPU (csdgen.engine.syncs.HostSyncCounter).

What is counted (the counter's module docstring): reads of a device tensor's values on the host
(``.item()``, ``bool``, ``.tolist()``), operations whose output shape depends on a device tensor
(``nonzero``, boolean-mask indexing), device -> host copies, and blocking host -> device copies
(``.to(device)`` without ``non_blocking``, ``torch.tensor(..., device=)``, a host tensor fed to a
device operation). Queued copies (:func:`csdgen.transfer.to_device`) are not syncs. Per iteration
(one ``_Loop._advance``, with the row selection after it when images finish) the engines make
exactly one: the read of the verify results. Setup (session, prefill) and the end (the result's
statistics) are counted apart and not asserted.

The model is the tiny Emu3 of tests/test_models_emu3.py: prompts of different lengths (masked
holes), row-end tokens (windows wider than their slots), images that finish at different iterations.
"""

import pytest
import torch
from test_models_emu3 import HEIGHT, NEGATIVE, WIDTH, build_checkpoint

import csdgen
from csdgen.engine.loop import _Loop
from csdgen.engine.syncs import HostSyncCounter
from csdgen.models import _ragged
from csdgen.models.emu3 import Emu3ImageModel
from csdgen.transfer import to_device, to_device_all

PROMPTS = ["a red cat", "two dogs on a long sunny beach", "x"]
DEVICE = torch.device("cpu")  # the run's device, as the engines name it (a torch.device object)


@pytest.fixture(scope="module")
def emu3(tmp_path_factory):
    return Emu3ImageModel.from_pretrained(build_checkpoint(tmp_path_factory.mktemp("emu3_syncs")), height=HEIGHT,
                                          width=WIDTH, negative_prompt=NEGATIVE)


def run_counted(model, **kwargs):
    options = dict(method="sjd", window=4, engine="eager", seed=0, sampling={"guidance_scale": 2.0})
    options.update(kwargs)
    with HostSyncCounter(model) as counter:
        result = csdgen.generate(model, PROMPTS, **options)
    return result, counter


@pytest.mark.parametrize("engine, window, tree", [
    ("eager", 4, None), ("static", 4, None), ("static", "auto", None), ("eager", "auto", None),
    ("eager", 1, None), ("eager", 4, (2, 2)), ("static", 4, (2, 2)),
])
def test_every_engine_makes_one_host_sync_per_iteration(emu3, engine, window, tree):
    result, counter = run_counted(emu3, engine=engine, window=window, tree=tree)
    assert result.settings["engine"] == engine
    assert counter.iterations == result.steps - 1 > 3  # the prefill is a step, not an iteration
    assert counter.per_iteration() == [1] * counter.iterations, counter.summary()
    for event in counter.syncs():
        if isinstance(event.phase, int):  # the one sync: the verify results read in _Loop._sync
            assert event.kind == "d2h" and "_sync" in event.where, counter.summary()
    assert max(counter.queued_per_iteration()) >= 1  # the index tensors travel, queued
    if window == 4 and tree is None:  # the run leaves rows behind (select_rows) and windows hold row ends
        assert len({image.steps for image in result.images}) > 1
    if window == "auto":
        assert max(result.widths) > 1  # the draft counts by depth bucket were taken


def test_an_added_read_in_the_loop_is_counted(emu3, monkeypatch):
    """Mutation: one ``int(tensor)`` of a device tensor per iteration makes two syncs per iteration."""
    keep = _Loop._keep_drafts

    def with_read(self, rows, c, q, widths):
        int(c.max())
        return keep(self, rows, c, q, widths)

    monkeypatch.setattr(_Loop, "_keep_drafts", with_read)
    _, counter = run_counted(emu3)
    assert counter.per_iteration() == [2] * counter.iterations
    assert sum(e.kind == "read" and isinstance(e.phase, int) for e in counter.syncs()) == counter.iterations


def test_blocking_copies_in_the_session_are_counted(emu3, monkeypatch):
    """Mutation: the eager session's index tensors copied with a plain ``.to(device)`` are a sync each."""
    monkeypatch.setattr(_ragged, "to_device_all", lambda tensors, device: [t.to(device) for t in tensors])
    _, counter = run_counted(emu3)
    per = counter.per_iteration()
    assert min(per) >= 1 + 4  # window layout (3) and position ids; the mask where rows have holes
    assert {e.kind for e in counter.syncs() if isinstance(e.phase, int)} == {"d2h", "h2d"}


# -- the counter's rules, on plain tensors ------------------------------------------------------------


def counted(fn):
    with HostSyncCounter(device=DEVICE) as counter:
        fn()
    return [e.kind for e in counter.events], counter


def test_reads_and_data_dependent_shapes_of_device_tensors_are_syncs():
    def body():
        dev = torch.arange(6, device=DEVICE)
        host = torch.arange(6)
        int(dev.sum())  # read
        bool((dev > 2).any())  # read
        dev.tolist()  # read
        dev[dev > 2]  # shape
        dev.nonzero()  # shape
        bool(host.any()), int(host[0]), host[host > 2], host.tolist()  # host values: free
        dev + 1, dev * host[0], torch.where(dev > 2, dev, 0)  # device work, 0-dim host operands: free
        dev[dev > 2] = 0  # one boolean index and a scalar: masked_fill, free
        torch.nn.functional.one_hot(dev % 3, 3)  # num_classes given: no read on CUDA

    kinds, _ = counted(body)
    assert kinds == ["read", "read", "read", "shape", "shape"]


def test_copies_between_host_and_device():
    def body():
        host = torch.arange(6)
        dev = host.to(DEVICE)  # h2d, blocking
        torch.tensor([1, 2], device=DEVICE)  # h2d
        dev[host[:2]]  # h2d: a host index of a device tensor
        dev.cpu()  # d2h
        host[:2] = dev[:2]  # d2h: a write into host memory
        to_device(host, DEVICE)  # queued: not a sync
        to_device_all([host, host > 2], DEVICE)  # queued
        torch.zeros(3, device=DEVICE) + dev[:3]  # made on the device: free

    kinds, counter = counted(body)
    assert kinds == ["h2d", "h2d", "h2d", "d2h", "d2h"]
    assert len(counter.queued) == 2


def test_the_model_tensors_given_are_device_tensors(cached_model):
    def body():
        weight = cached_model.backbone.lm_head.weight.detach()
        float(weight[0, 0])
        weight[0, 0].item()

    with HostSyncCounter(cached_model) as counter:
        body()
    assert [e.kind for e in counter.events] == ["read", "read"]


def test_to_device_all_keeps_shapes_and_dtypes():
    tensors = [torch.arange(6).reshape(2, 3), torch.tensor([[True, False]]), torch.tensor([3], dtype=torch.int8)]
    moved = to_device_all(tensors, DEVICE)
    for a, b in zip(tensors, moved):
        assert b.dtype == a.dtype and torch.equal(a, b)
    with pytest.raises(ValueError, match="float32.*allowed: integer or bool"):
        to_device_all([torch.zeros(2)], DEVICE)
