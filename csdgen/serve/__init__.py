"""``csdgen serve``: an OpenAI-compatible image server with continuous batching.

One process serves one model. A scheduler thread owns it and runs one
:class:`csdgen.engine.ContinuousBatch`: at every iteration boundary waiting images join the
running batch (their prefill joined to the per-row cache) and finished or cancelled ones leave
it, so requests share forwards and no row idles while its batch's slowest image finishes.

Modules (one idea each): :mod:`~csdgen.serve.schemas` (the request fields, their checks, the
OpenAI error shape), :mod:`~csdgen.serve.scheduler` (admission, iterations, cancellation,
faults), :mod:`~csdgen.serve.worker` (decoding and PNG encoding off the scheduler thread),
:mod:`~csdgen.serve.images` (tokens -> PNG, partial images), :mod:`~csdgen.serve.metrics`
(Prometheus), :mod:`~csdgen.serve.logs` (access, start-up and shutdown lines),
:mod:`~csdgen.serve.app` (the FastAPI routes and uvicorn), :mod:`~csdgen.serve.deployment` (a Ray
Serve replica: one scheduler, one model, one device) and :mod:`~csdgen.serve.replicas` (the Ray
Serve application ``serve run`` and a cluster's config deploy; Ray is imported by these two only).
docs/serve.md says how to run it, replicas on Ray Serve, and what it measured.
"""

from .app import BackgroundServer, ServedModel, create_app, run_server
from .schemas import APIError, ServeDefaults

__all__ = ["APIError", "BackgroundServer", "ServeDefaults", "ServedModel", "create_app", "run_server"]
