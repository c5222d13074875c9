"""The scheduler: one thread that owns the model and runs continuous batching over the requests.

Requests (checked by :func:`csdgen.serve.schemas.parse_request`) queue their images; the
scheduler thread loops:

1. **cancellations**: images of requests whose client went away leave the queue, and their rows
   leave the running batch (:meth:`csdgen.engine.ContinuousBatch.cancel`);
2. **admission** (the iteration boundary): waiting images join the running batch, oldest
   first, up to the capacity (``--max-batch`` and the memory estimate), all those of one round
   in one prefill (:meth:`~csdgen.engine.ContinuousBatch.admit`). Images share a batch only
   when they share its settings (method, window, drafting, sampling: one rule and one forward
   for all); when the oldest waiting image has other settings, admission stops and the batch
   drains, then the batch of those settings runs. ``batching="static"`` admits only into an
   empty batch (a batch filled, run to its end, then the next: the benchmark's baseline);
3. **one iteration** (:meth:`~csdgen.engine.ContinuousBatch.step`); completed images are
   decoded to PNG and sent to their requests; streaming requests get partial images.

Image ``i`` of a request seeded ``s`` is admitted with ``seeds=[s]``, ``image_indices=[i]``:
with a fixed window its tokens are those of ``csdgen.generate(..., seed=s, image_indices=[i])``
whatever else shares its batch (:mod:`csdgen.engine.continuous`).

Faults stay local: an admission the model rejects fails the requests admitted with it; an
exception inside the model during an iteration ends the requests with images in that batch
(500, naming the exception) and the batch is dropped; the thread goes on serving.

Events reach a request's asyncio queue through its event loop's ``call_soon_threadsafe``:
``("partial", image_index, png, committed, forwards, partial_index)``, ``("image",
image_index, png, stats, tokens)``, ``("error", APIError)``, ``("done",)``.
"""

from __future__ import annotations

import collections
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from .schemas import APIError, ImageRequest

__all__ = ["Job", "Scheduler"]


@dataclass
class Job:
    """One request in the scheduler."""

    request: ImageRequest
    loop: Any  #: the asyncio loop of the request's handler
    events: Any  #: its asyncio.Queue
    created: float = field(default_factory=time.perf_counter)
    remaining: int = 0
    cancelled: bool = False
    finished: bool = False

    def post(self, event: tuple) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the handler's loop is gone (server shutting down)
            pass


@dataclass
class _Image:
    job: Job
    index: int
    forwards: int = 0  #: iterations this image has been through in the batch
    partials: int = 0  #: partial images sent


class Scheduler:
    """Continuous batching over one model (see the module docstring).

    Args:
        served: the :class:`csdgen.serve.app.ServedModel`.
        capacity: most images in the running batch.
        max_queue: most images waiting (a request that would pass it gets 429; one alone in an
            empty queue is always accepted).
        batching: ``"continuous"`` or ``"static"``.
        metrics: the server's :class:`csdgen.serve.metrics.ServeMetrics`.
    """

    KEEP_BATCHES = 8  #: idle batches kept per settings (their window="auto" measurements)

    def __init__(self, served, *, capacity: int, max_queue: int, batching: str = "continuous", metrics=None):
        if batching not in ("continuous", "static"):
            raise ValueError(f"batching={batching!r}: allowed continuous, static")
        self.served, self.capacity, self.max_queue, self.batching = served, int(capacity), int(max_queue), batching
        self.metrics = metrics
        self._cond = threading.Condition()
        self._queue: collections.deque[_Image] = collections.deque()
        self._cancels: list[Job] = []
        self._stop = False
        self._batches: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
        self._batch = None  # the running ContinuousBatch
        self._key = None
        self._rows: dict[int, _Image] = {}  # handle -> image of the running batch
        self._admitting: list[Job] = []  # jobs of an admission that raised (they fail with the batch)
        self._done_times: collections.deque[float] = collections.deque(maxlen=64)
        self._thread = threading.Thread(target=self._run, name="csdgen-scheduler", daemon=True)
        if metrics is not None:
            metrics.capacity.set(self.capacity)

    # -- the request side (event-loop threads) ---------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread after its current iteration; requests still open get a 503."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def occupancy(self) -> int:
        batch = self._batch
        return 0 if batch is None else batch.size

    def retry_after(self) -> int:
        """Seconds after which the queue has likely room again (1 .. 60), from recent throughput."""
        times = list(self._done_times)
        if len(times) < 2 or times[-1] <= times[0]:
            return 1
        rate = (len(times) - 1) / (times[-1] - times[0])
        return int(min(60, max(1, round(len(self._queue) / max(rate, 1e-9) / 2))))

    def submit(self, request: ImageRequest, loop, events) -> Job:
        """Queue a request's images.

        Raises:
            APIError: 429 when the queue is full, 503 when the scheduler is not running (both
                with ``Retry-After``).
        """
        job = Job(request, loop, events, remaining=request.n)
        with self._cond:
            if not self.alive:
                raise APIError(503, "the server is not serving (stopping, or its scheduler failed); retry later",
                               code="unavailable", headers={"Retry-After": "5"})
            if self._queue and len(self._queue) + request.n > self.max_queue:
                raise APIError(429, f"the queue is full: {len(self._queue)} images waiting, at most {self.max_queue}; "
                                    f"retry after the Retry-After seconds", code="queue_full",
                               headers={"Retry-After": str(self.retry_after())})
            self._queue.extend(_Image(job, i) for i in range(request.n))
            self._gauges()
            self._cond.notify_all()
        return job

    def cancel(self, job: Job) -> None:
        """The client went away: its images leave the queue and the batch at the next iteration boundary."""
        with self._cond:
            if job.finished or job.cancelled:
                return
            job.cancelled = True
            self._cancels.append(job)
            self._cond.notify_all()

    # -- the scheduler thread ----------------------------------------------------------------------

    def _gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self._queue))
            self.metrics.occupancy.set(self.occupancy)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._queue and not self._cancels and not self.occupancy:
                    self._cond.wait()
                if self._stop:
                    break
                cancels, self._cancels = self._cancels, []
                dropped = self._drop_waiting(cancels)
                take = self._take()
                self._gauges()
            try:
                self._cancel_rows(cancels, dropped)
                if take:
                    self._admit(take)
                if self.occupancy:
                    self._step()
            except Exception as exc:  # a fault of the batch, not of one request: end its requests, keep serving
                self._fail_batch(exc)
            with self._cond:
                self._gauges()
        self._shutdown()

    def _drop_waiting(self, cancels: list[Job]) -> int:
        if not cancels:
            return 0
        gone = {id(j) for j in cancels}
        before = len(self._queue)
        self._queue = collections.deque(im for im in self._queue if id(im.job) not in gone)
        return before - len(self._queue)

    def _cancel_rows(self, cancels: list[Job], dropped: int) -> None:
        count = dropped
        if cancels and self._batch is not None:
            gone = {id(j) for j in cancels}
            handles = [h for h, im in self._rows.items() if id(im.job) in gone]
            if handles:
                self._batch.cancel(handles)
                for h in handles:
                    del self._rows[h]
                count += len(handles)
        for job in cancels:
            job.finished = True
        if count and self.metrics is not None:
            self.metrics.cancelled.inc(count)

    def _batch_for(self, key: tuple, request: ImageRequest):
        from csdgen.engine.continuous import ContinuousBatch

        batch = self._batches.pop(key, None)
        if batch is None:
            # a static session preallocated for the most images the batch holds (--max-batch)
            batch = ContinuousBatch(self.served.model, capacity=self.capacity, **request.batch_kwargs,
                                    **getattr(self.served, "engine_kwargs", {}))
        self._batches[key] = batch
        while len(self._batches) > self.KEEP_BATCHES:
            self._batches.popitem(last=False)
        return batch

    def _take(self) -> list[_Image]:
        """Images to admit at this boundary (called under the lock)."""
        if not self._queue:
            return []
        if self.occupancy == 0:
            head = self._queue[0]
            if self._key != head.job.request.key or self._batch is None:
                self._batch = self._batch_for(head.job.request.key, head.job.request)
                self._key = head.job.request.key
        elif self.batching == "static":
            return []
        if not self._batch.admits_while_running and self.occupancy:
            return []
        free = self.capacity - self.occupancy
        take = []
        while self._queue and free > 0 and self._queue[0].job.request.key == self._key:
            take.append(self._queue.popleft())
            free -= 1
        return take

    def _admit(self, take: list[_Image]) -> None:
        batch = self._batch
        conditions = [im.job.request.condition for im in take]
        seeds = [im.job.request.seed for im in take]
        indices = [im.index for im in take]
        try:
            handles = batch.admit(conditions, seeds, indices)
        except ValueError as exc:  # the model rejected these images' conditions: they fail, the batch goes on
            message, param = f"the model rejected this request's images: {exc}", "prompt"
            if "overflow float32" in str(exc):  # the loop's own diagnosis: the sampling settings, not the prompt
                sampling = take[0].job.request.batch_kwargs["sampling"]
                message = f"guidance_scale={sampling.guidance_scale:g}, temperature={sampling.temperature:g}: {exc}"
                param = "temperature" if sampling.temperature and abs(sampling.guidance_scale) < 1e30 else "guidance_scale"
            for job in {id(im.job): im.job for im in take}.values():
                self._fail(job, APIError(400, message, param=param, code="invalid_value"))
            return
        except Exception:
            self._admitting = [im.job for im in take]  # they fail with the batch (_fail_batch)
            raise
        for h, im in zip(handles, take):
            self._rows[h] = im
        if self.metrics is not None:
            self.metrics.forwards.inc()

    def _step(self) -> None:
        batch = self._batch
        size = batch.size
        finished = batch.step()
        if self.metrics is not None:
            self.metrics.forwards.inc()
            self.metrics.iterations.inc()
            self.metrics.rows.inc(size)
        for image in finished:
            im = self._rows.pop(image.handle)
            self._deliver(im, image)
        for im in self._rows.values():
            im.forwards += 1
        self._partials()

    def _deliver(self, im: _Image, image) -> None:
        from .images import png_bytes

        job = im.job
        if job.cancelled or job.finished:
            return
        try:
            png = png_bytes(self.served.model, image.tokens)
        except Exception as exc:
            self._fail(job, APIError(500, f"the model failed to decode an image: {type(exc).__name__}: {exc}",
                                     code="model_error"))
            return
        self._done_times.append(time.perf_counter())
        if self.metrics is not None:
            self.metrics.images.inc()
            self.metrics.step_compression.observe(image.stats.step_compression)
        job.post(("image", im.index, png, image.stats, image.tokens))
        job.remaining -= 1
        if job.remaining == 0:
            job.finished = True
            if self.metrics is not None:
                self.metrics.latency.observe(time.perf_counter() - job.created)
            job.post(("done",))

    def _partials(self) -> None:
        """Partial images for streaming requests: every ``partial_every`` forwards of the image, or
        ``partial_images`` of them spread over the image's committed tokens."""
        due = []
        N = self.served.model.num_image_tokens
        streaming = [(h, im) for h, im in self._rows.items() if im.job.request.stream and not im.job.cancelled]
        if not streaming:
            return
        committed, tokens = self._batch.progress([h for h, _ in streaming])
        for (h, im), c, t in zip(streaming, committed, tokens):
            r = im.job.request
            if r.partial_every is not None:
                if im.forwards % r.partial_every == 0:
                    due.append((im, c, t))
            elif r.partial_images and im.partials < r.partial_images and c >= (im.partials + 1) * N / (r.partial_images + 1):
                due.append((im, c, t))
        from .images import partial_png

        for im, c, t in due:
            png = partial_png(self.served.model, t, c)
            im.job.post(("partial", im.index, png, c, im.forwards, im.partials))
            im.partials += 1

    def _fail(self, job: Job, error: APIError) -> None:
        if job.finished:
            return
        job.finished = True
        job.post(("error", error))

    def _fail_batch(self, exc: Exception) -> None:
        """An exception inside the model: the requests with images in the batch get a 500; the batch is dropped."""
        detail = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        error = APIError(500, f"the model failed while decoding this request's images ({detail}); "
                              f"the server goes on serving other requests", code="model_error")
        jobs = {id(im.job): im.job for im in self._rows.values()}
        jobs.update({id(job): job for job in self._admitting})
        self._admitting = []
        for job in jobs.values():
            self._fail(job, error)
        with self._cond:  # their images still waiting are dropped too
            failed = set(jobs)
            self._queue = collections.deque(im for im in self._queue if id(im.job) not in failed)
        self._rows.clear()
        if self._key is not None:
            self._batches.pop(self._key, None)
        self._batch, self._key = None, None

    def _shutdown(self) -> None:
        error = APIError(503, "the server is stopping; retry on another replica or later", code="unavailable",
                         headers={"Retry-After": "5"})
        jobs = {id(im.job): im.job for im in list(self._rows.values()) + list(self._queue)}
        for job in jobs.values():
            self._fail(job, error)
        self._rows.clear()
        self._queue.clear()
