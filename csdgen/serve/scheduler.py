"""The scheduler: one thread that owns the model and runs continuous batching over the requests.

Requests (checked by :func:`csdgen.serve.schemas.parse_request`) queue their images; the
scheduler thread loops:

1. **cancellations**: images of requests whose client went away leave the queue, and their rows
   leave the running batch (:meth:`csdgen.engine.ContinuousBatch.cancel`);
2. **admission** (the iteration boundary): waiting images join the running batch, oldest
   first, up to the capacity (``--max-batch`` and the memory estimate), all those of one round
   in one prefill (:meth:`~csdgen.engine.ContinuousBatch.admit`; into a running static batch,
   images whose prompt is one token take it in the next iteration's window). Images share a batch only
   when they share its settings (method, window, drafting, sampling: one rule and one forward
   for all); when the oldest waiting image has other settings, admission stops and the batch
   drains, then the batch of those settings runs. ``batching="static"`` admits only into an
   empty batch (a batch filled, run to its end, then the next: the benchmark's baseline);
3. **one iteration** (:meth:`~csdgen.engine.ContinuousBatch.step`); the tokens of completed
   images, and of the partial images streaming requests get, go to the image worker
   (:class:`csdgen.serve.worker.ImageWorker`), whose thread decodes them to PNG and sends them to
   their requests while this thread runs the next iteration.

Image ``i`` of a request seeded ``s`` is admitted with ``seeds=[s]``, ``image_indices=[i]``:
with a fixed window its tokens are those of ``csdgen.generate(..., seed=s, image_indices=[i])``
whatever else shares its batch (:mod:`csdgen.engine.continuous`).

Faults stay local: an admission the model rejects fails the requests admitted with it; an
exception inside the model during an iteration ends the requests with images in that batch
(500, naming the exception) and the batch is dropped (non-finite logits at a prefill taken in an
iteration's window are such an exception); the thread goes on serving. An image the
worker cannot decode ends its request (500). When the scheduler stops, the requests still waiting
or decoding get 503, and the worker finishes the images it holds (for at most ``DRAIN_SECONDS``;
the requests of those it could not finish get 503 too).

A full queue's 429 carries ``Retry-After``: :meth:`Scheduler.expected_wait` rounded up, at least 1.

Events reach a request's asyncio queue (from this thread or the worker's; a request's state
changes under one lock, so an image never follows its request's error) through its event
loop's ``call_soon_threadsafe``: ``("partial", image_index, png, committed, forwards, partial_index)``, ``("image",
image_index, png, stats, tokens)``, ``("error", APIError)``, ``("done",)``.
"""

from __future__ import annotations

import collections
import math
import threading
import time
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
    admitted: float = 0.0  #: perf_counter when it joined the batch


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
    DRAIN_SECONDS = 10.0  #: at stop, the most seconds the image worker may take to finish the images it holds
    PACE_IMAGES = 32  #: finished images whose seconds in the batch Retry-After averages

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
        self._jobs = threading.Lock()  # a request's state (remaining, finished) and its events, from both threads
        self._worker = None  # the ImageWorker, made by start()
        # the pace Retry-After uses (written by this thread under _cond): seconds finished images spent
        # in the batch, and the seconds of the last iteration
        self._in_batch: collections.deque[float] = collections.deque(maxlen=self.PACE_IMAGES)
        self._iteration_seconds: float | None = None
        import torch

        #: torch CPU threads the scheduler thread decodes with: the constructing thread's count
        self.threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._run, name="csdgen-scheduler", daemon=True)
        if metrics is not None:
            metrics.capacity.set(self.capacity)

    # -- the request side (event-loop threads) ---------------------------------------------------

    def start(self) -> None:
        from .worker import ImageWorker

        self._worker = ImageWorker(self.served.model)  # returns once its thread runs torch on one thread
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

    def expected_wait(self) -> float | None:
        """Seconds until the images waiting now have all joined the batch (call it under the lock).

        The seconds an image spends in the batch (the mean over the last ``PACE_IMAGES`` finished
        ones; before the first finishes, the last iteration's seconds times the image's tokens,
        the most forwards an image takes) times the images waiting, divided by the batch capacity
        (that many images decode together, so a row frees every ``seconds / capacity``).
        ``None`` before any iteration was measured.
        """
        if self._in_batch:
            per_image = sum(self._in_batch) / len(self._in_batch)
        elif self._iteration_seconds is not None:
            per_image = self._iteration_seconds * self.served.model.num_image_tokens
        else:
            return None
        return per_image * len(self._queue) / max(self.capacity, 1)

    def retry_after(self) -> int:
        """``Retry-After`` of a full queue's 429, in whole seconds: :meth:`expected_wait` rounded up,
        at least 1 (1 before anything was measured). Called under the lock."""
        wait = self.expected_wait()
        return 1 if wait is None else max(1, math.ceil(wait))

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
            waiting = len(self._queue)
            if waiting and waiting + request.n > self.max_queue:  # the queue need not be full to refuse n images
                alone = (f" (a request of more than {self.max_queue} images is taken only into an empty queue)"
                         if request.n > self.max_queue else "")
                raise APIError(429, f"n={request.n}: the queue has no room for this request's images: {waiting} "
                                    f"image{'' if waiting == 1 else 's'} waiting, at most {self.max_queue}{alone}; "
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
        from csdgen.torch_threads import set_threads

        set_threads(self.threads)  # its own count, after the image worker's one (csdgen.torch_threads)
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

    def _drop_waiting(self, jobs) -> int:
        """Remove the waiting images of ``jobs`` (cancelled, rejected or failed) from the queue; the
        caller holds ``self._cond``. Returns how many left."""
        if not jobs:
            return 0
        gone = {id(j) for j in jobs}
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
        with self._jobs:
            for job in cancels:
                job.finished = True
        if count and self.metrics is not None:
            self.metrics.cancelled.inc(count)

    def _batch_for(self, key: tuple, request: ImageRequest):
        from csdgen.engine import ContinuousBatch

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
        forwards = batch.forwards
        try:
            handles = batch.admit(conditions, seeds, indices)
        except ValueError as exc:  # the model rejected these images' conditions: they fail, the batch goes on
            message, param = f"the model rejected this request's images: {exc}", "prompt"
            if "overflow float32" in str(exc):  # the loop's own diagnosis: the sampling settings, not the prompt
                sampling = take[0].job.request.batch_kwargs["sampling"]
                message = f"guidance_scale={sampling.guidance_scale:g}, temperature={sampling.temperature:g}: {exc}"
                param = "temperature" if sampling.temperature and abs(sampling.guidance_scale) < 1e30 else "guidance_scale"
            rejected = {id(im.job): im.job for im in take}
            for job in rejected.values():
                self._fail(job, APIError(400, message, param=param, code="invalid_value"))
            with self._cond:  # their images still waiting leave too: they would join the next admission and fail it
                self._drop_waiting(list(rejected.values()))
                self._gauges()
            return
        except Exception:
            self._admitting = [im.job for im in take]  # they fail with the batch (_fail_batch)
            raise
        now = time.perf_counter()
        for h, im in zip(handles, take):
            self._rows[h] = im
            im.admitted = now
        if self.metrics is not None and batch.forwards > forwards:  # a prefill forward (none where it is folded)
            self.metrics.forwards.inc(batch.forwards - forwards)

    def _step(self) -> None:
        batch = self._batch
        size = batch.size
        began = time.perf_counter()
        finished = batch.step()
        now = time.perf_counter()
        if self.metrics is not None:
            self.metrics.forwards.inc()
            self.metrics.iterations.inc()
            self.metrics.rows.inc(size)
        gone = [(self._rows.pop(image.handle), image) for image in finished]
        with self._cond:  # the pace Retry-After reads (under this lock, in the request's thread)
            self._iteration_seconds = now - began
            self._in_batch.extend(now - im.admitted for im, _ in gone)
        for im, image in gone:
            self._deliver(im, image)
        for im in self._rows.values():
            im.forwards += 1
        self._partials()

    def _deliver(self, im: _Image, image) -> None:
        """Hand a finished image to the worker; its PNG goes to the request from the worker's thread."""
        from .worker import Work

        job = im.job
        if job.cancelled or job.finished:
            return

        def failed(exc: Exception) -> None:
            self._fail(job, APIError(500, f"the model failed to decode an image: {type(exc).__name__}: {exc}",
                                     code="model_error"))

        # image.tokens: [N] int64 on the host (ContinuousBatch copies them after the iteration)
        self._worker.submit(Work(image.tokens, None, lambda png: self._image_done(im, image, png), failed, job))

    def _image_done(self, im: _Image, image, png: bytes) -> None:
        """The worker encoded a finished image: it goes to its request (the last one: ``done``)."""
        job = im.job
        with self._jobs:
            if job.cancelled or job.finished:
                return
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
        from .worker import Work

        for im, c, t in due:
            event = ("partial", im.index, None, c, im.forwards, im.partials)
            self._worker.submit(Work(t, c, lambda png, job=im.job, event=event: self._partial_done(job, event, png),
                                     lambda exc, job=im.job: self._partial_failed(job, exc), im.job))
            im.partials += 1

    def _partial_done(self, job: Job, event: tuple, png: bytes) -> None:
        with self._jobs:
            if not (job.cancelled or job.finished):
                job.post(event[:2] + (png,) + event[3:])

    def _partial_failed(self, job: Job, exc: Exception) -> None:
        self._fail(job, APIError(500, f"the model failed to decode a partial image: {type(exc).__name__}: {exc}",
                                 code="model_error"))

    def _fail(self, job: Job, error: APIError) -> None:
        with self._jobs:
            if job.finished:
                return
            job.finished = True
            job.post(("error", error))

    def _fail_batch(self, exc: Exception) -> None:
        """An exception inside the model: the requests with images in the batch get a 500; the batch is dropped."""
        from .logs import log

        detail = f"{type(exc).__name__}: {exc}"
        log.error("a batch failed; its requests get 500 and the server goes on: %s", detail, exc_info=exc)
        error = APIError(500, f"the model failed while decoding this request's images ({detail}); "
                              f"the server goes on serving other requests", code="model_error")
        jobs = {id(im.job): im.job for im in self._rows.values()}
        jobs.update({id(job): job for job in self._admitting})
        self._admitting = []
        for job in jobs.values():
            self._fail(job, error)
        with self._cond:  # their images still waiting are dropped too
            self._drop_waiting(list(jobs.values()))
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
        with self._cond:
            self._queue.clear()
        if self._worker is not None:  # the images it holds reach their requests, or those get the 503
            for work in self._worker.close(self.DRAIN_SECONDS):
                self._fail(work.owner, error)
