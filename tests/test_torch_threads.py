"""Torch's CPU threads where several Python threads run torch (:mod:`csdgen.torch_threads`): work
done once runs in a thread that ends with it, the server's image worker runs torch on one thread
while its scheduler keeps the process's count, a count a thread set stays its own, and the served
model and the demo's model load off the calling thread."""

import subprocess
import sys
import threading

import httpx
import pytest
import torch

from csdgen.serve import BackgroundServer, ServeDefaults, ServedModel, create_app, images
from csdgen.serve.scheduler import Scheduler
from csdgen.torch_threads import call_in_thread, set_threads, single_threaded

from serve_fixture import slow_model

TIMEOUT = 60


def test_call_in_thread_returns_from_another_thread_that_has_ended():
    seen = {}

    def work(a, *, b):
        seen["thread"] = threading.current_thread()
        return a + b

    assert call_in_thread(work, 2, b=3) == 5
    assert seen["thread"] is not threading.current_thread()
    assert not seen["thread"].is_alive()


@pytest.mark.parametrize("error", [ValueError("bad --window"), SystemExit(2), KeyboardInterrupt()])
def test_call_in_thread_raises_what_the_call_raised(error):
    def work():
        raise error

    with pytest.raises(type(error)) as caught:
        call_in_thread(work)
    assert caught.value is error


@pytest.mark.parametrize("count", [0, -2, 1.5, True])
def test_set_threads_refuses_what_is_not_an_integer_of_one_or_more(count):
    with pytest.raises(ValueError, match=f"count={count}: allowed an integer >= 1"):
        set_threads(count)


# a helper thread sets one thread, then another thread sets the process-wide count to 2, then the
# helper runs its first torch operator: the helper's count must still be 1
_KEEP_SCRIPT = """
import threading, torch
from csdgen.torch_threads import set_threads, single_threaded
torch.set_num_threads(2)
ready, other_set, out = threading.Event(), threading.Event(), {}
def helper():
    single_threaded()
    ready.set()
    other_set.wait(30)
    torch.ones(4).sum()
    out["helper"] = torch.get_num_threads()
def other():
    set_threads(2)
    out["other"] = torch.get_num_threads()
h = threading.Thread(target=helper); h.start(); ready.wait(30)
o = threading.Thread(target=other); o.start(); o.join(30)
other_set.set(); h.join(30)
print(out["helper"], out["other"])
"""


def test_a_thread_keeps_the_count_it_set_after_another_thread_sets_its_own():
    """torch gives a thread the process-wide count the first time the thread asks for it, even after
    a set of its own; the helper's one thread must survive another thread's later setting (in a
    child process: the process-wide count is the point of the test)."""
    out = subprocess.run([sys.executable, "-c", _KEEP_SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "2"]


@pytest.fixture
def two_threads():
    """The test's thread at 2 torch threads (on a 1-CPU machine too), its count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield 2
    finally:
        torch.set_num_threads(before)


def test_the_image_worker_runs_torch_on_one_thread_and_the_scheduler_on_the_servers_count(cached_model, monkeypatch,
                                                                                        two_threads):
    """The image worker's decode runs on one torch thread (no OpenMP pool of its own) and the
    scheduler's iterations on the count of the thread that made the server; a thread started after
    the server still takes that count."""
    seen = {"decode": set(), "step": set()}
    real_png, real_step = images.png_bytes, Scheduler._step

    def png(model, tokens):
        seen["decode"].add(torch.get_num_threads())
        return real_png(model, tokens)

    def step(self):
        seen["step"].add(torch.get_num_threads())
        return real_step(self)

    monkeypatch.setattr(images, "png_bytes", png)
    monkeypatch.setattr(Scheduler, "_step", step)
    served = ServedModel(slow_model(cached_model, 0.0), "slow", defaults=ServeDefaults(method="ar"))
    with BackgroundServer(create_app(served, capacity=4)) as server:
        answer = httpx.post(server.url + "/v1/images/generations", json={"prompt": "0", "n": 2, "seed": 1},
                            timeout=TIMEOUT)
        assert answer.status_code == 200
    assert seen == {"decode": {1}, "step": {two_threads}}
    later = {}
    thread = threading.Thread(target=lambda: later.setdefault("count", torch.get_num_threads()))
    thread.start()
    thread.join(TIMEOUT)
    assert later["count"] == two_threads


def test_single_threaded_sets_this_threads_count_to_one(two_threads):
    out = {}

    def helper():
        single_threaded()
        out["count"] = torch.get_num_threads()

    thread = threading.Thread(target=helper)
    thread.start()
    thread.join(TIMEOUT)
    torch.set_num_threads(two_threads)  # what the thread that starts a helper does after it (module docstring)
    assert out["count"] == 1


def test_csdgen_serve_loads_its_model_off_the_calling_thread(monkeypatch):
    from csdgen.cli import serve

    seen = {}

    def load(args):
        seen["thread"] = threading.current_thread()
        return "served", 4, "request"

    monkeypatch.setattr(serve, "_served_model", load)
    assert serve.served_model(object()) == ("served", 4, "request")
    assert seen["thread"] is not threading.current_thread() and not seen["thread"].is_alive()


def test_the_demo_loads_its_model_off_the_calling_thread(monkeypatch):
    from csdgen import demo

    seen = {}

    class Stop(Exception):
        pass

    def load(*args, **kwargs):
        seen["thread"] = threading.current_thread()
        raise Stop

    monkeypatch.setattr(demo, "load_demo_model", load)
    with pytest.raises(Stop):
        demo.serve(port=0, block=False)
    assert seen["thread"] is not threading.current_thread()


def test_a_served_model_decodes_its_probe_image_off_the_calling_thread(cached_model, monkeypatch):
    """ServedModel decodes one image to learn the image size: not on the thread that makes it
    (often the main one, which would then hold an OpenMP pool beside the scheduler's)."""
    seen = {}
    real = images.image_size

    def size(model):
        seen["thread"] = threading.current_thread()
        return real(model)

    monkeypatch.setattr(images, "image_size", size)
    served = ServedModel(slow_model(cached_model, 0.0), "slow")
    assert served.size == real(served.model)
    assert seen["thread"] is not threading.current_thread() and not seen["thread"].is_alive()
