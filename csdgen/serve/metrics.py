"""The server's Prometheus metrics (``GET /metrics``, prometheus-client's text format).

One :class:`ServeMetrics` per server, in its own registry (two servers in one process, as the
tests run them, do not share counters). Names:

* ``csdgen_requests_total{status}``: answered requests by HTTP status (a stream counts when it
  ends: 200 once every image was sent, 499 when the client left first, else its error's status);
* ``csdgen_images_total``: images completed; ``csdgen_images_cancelled_total``: images whose
  client went away (removed from the batch or the queue);
* ``csdgen_forwards_total``: model forwards (iterations of the running batch and the admission
  prefills that run a forward of their own: not those taken in an iteration's window);
  ``csdgen_batch_iterations_total`` and ``csdgen_batch_rows_total`` (images in the batch, summed
  over iterations): mean batch occupancy = rows / iterations;
* ``csdgen_queue_depth``: images waiting; ``csdgen_batch_occupancy``: images in the running
  batch now; ``csdgen_batch_capacity``: the most it admits (``--max-batch`` and the memory
  estimate);
* ``csdgen_step_compression``: histogram of images' tokens per forward (N / forwards);
* ``csdgen_request_latency_seconds``: histogram of request latency (arrival to last image).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

__all__ = ["ServeMetrics", "CONTENT_TYPE_LATEST"]


class ServeMetrics:
    """Counters, gauges and histograms of one server (module docstring)."""

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("csdgen_requests", "Answered requests, by HTTP status", ["status"], registry=r)
        self.images = Counter("csdgen_images", "Images completed", registry=r)
        self.cancelled = Counter("csdgen_images_cancelled", "Images cancelled (client disconnected)", registry=r)
        self.forwards = Counter("csdgen_forwards", "Model forwards (batch iterations and admission prefills)", registry=r)
        self.iterations = Counter("csdgen_batch_iterations", "Iterations of the running batch", registry=r)
        self.rows = Counter("csdgen_batch_rows", "Images in the batch, summed over iterations", registry=r)
        self.queue_depth = Gauge("csdgen_queue_depth", "Images waiting for a batch row", registry=r)
        self.occupancy = Gauge("csdgen_batch_occupancy", "Images in the running batch", registry=r)
        self.capacity = Gauge("csdgen_batch_capacity", "Most images the batch admits", registry=r)
        self.step_compression = Histogram("csdgen_step_compression", "Image tokens per forward, per image",
                                          buckets=(1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 12, 16, 32), registry=r)
        self.latency = Histogram("csdgen_request_latency_seconds", "Request latency, arrival to last image",
                                 buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600), registry=r)

    def text(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
