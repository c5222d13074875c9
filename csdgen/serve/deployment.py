"""``csdgen serve`` on Ray Serve: each replica one scheduler owning one model and one device.

A replica (:class:`CsdgenReplica`) loads its model from ``csdgen serve`` options in its own
process and serves the app of :func:`csdgen.serve.app.create_app`, unchanged, as Ray Serve's
FastAPI ingress: the OpenAI Images API, ``/v1/models``, ``/health`` and ``/metrics`` behind Ray
Serve's HTTP proxy. Ray places the replicas (``num_gpus=1`` each where there are GPUs), routes
requests to them, checks their health (:meth:`CsdgenReplica.check_health` asks the app's own
``GET /health``), restarts one whose process dies, and autoscales by ongoing requests per
replica when asked to. Nothing here balances load or manages processes.

An image depends only on its request's prompt, seed, image index and settings (the scheduler's
per-image random streams keyed by ``(seed, image index, forward count)``), so any replica serves
any request. Every answer carries ``x-csdgen-replica`` (Ray's replica id) and
``x-csdgen-replica-pid`` (the replica's process id), so a client or a test sees which replica
answered.

:func:`application` binds the deployment (what ``serve run`` and a Ray cluster's config deploy,
through :func:`csdgen.serve.replicas.app`); :func:`run_local` starts a local Ray and Serve and
runs it until interrupted (``csdgen serve --replicas N``). Ray is imported by these functions only.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any, Callable

__all__ = ["CsdgenReplica", "ReplicaFailure", "proxy_middlewares", "application", "deployment_options", "gpus_for", "run_local", "REPLICA_HEADER",
           "PID_HEADER", "APP_NAME"]

REPLICA_HEADER = "x-csdgen-replica"  #: Ray Serve's replica id of the replica that answered
PID_HEADER = "x-csdgen-replica-pid"  #: its process id
APP_NAME = "csdgen"  #: the Serve application's name (``serve status`` lists it)
HEALTH_TIMEOUT = 10.0  #: seconds the app's /health may take inside check_health


def _require_ray():
    try:
        import ray  # noqa: F401
        from ray import serve
    except ImportError as exc:
        raise ValueError(f"replicas on Ray Serve need Ray ({exc}); install it with: pip install -c constraints.txt \".[ray]\" in the csdgen checkout") from None
    return serve


class _ReplicaHeaders:
    """ASGI middleware: every HTTP answer gets the replica's id and process id as headers."""

    def __init__(self, app, headers: list[tuple[bytes, bytes]]):
        self.app, self.headers = app, headers

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


#: what Ray Serve's HTTP proxy imports (environment variable RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH)
#: for :class:`ReplicaFailure`; :func:`run_local` sets it, a cluster sets it where ``ray start`` runs
PROXY_CALLBACK = "csdgen.serve.deployment:proxy_middlewares"
PROXY_CALLBACK_VARIABLE = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"


class ReplicaFailure:
    """ASGI middleware of Ray Serve's HTTP proxy: a request whose replica stopped before answering
    (its process died, or Ray could not reach it) gets 502 in OpenAI's error shape naming that,
    with ``Retry-After``, where the proxy alone answers a bare ``500 Internal Server Error``
    (it sends nothing and the HTTP server fills in that text). Every other answer passes unchanged."""

    MESSAGE = ("the replica serving this request stopped before answering (its process died or Ray could not reach "
               "it: {cause}); Ray Serve restarts it and routes new requests to live replicas: send the request again")

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watch(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        cause = "see the proxy's log"
        try:
            await self.app(scope, receive, watch)
        except Exception as exc:  # the proxy raised instead of answering
            cause = f"{type(exc).__name__}: {exc}"
        if started:
            return
        from .schemas import error_body

        body = json.dumps(error_body(self.MESSAGE.format(cause=cause), "server_error", None, "replica_failed")).encode()
        try:
            await send({"type": "http.response.start", "status": 502,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                    (b"retry-after", b"1")]})
            await send({"type": "http.response.body", "body": body})
        except Exception:  # the client is gone too: nobody to tell
            pass


def proxy_middlewares() -> list:
    """The middlewares Ray Serve's HTTP proxy adds (:data:`PROXY_CALLBACK`): :class:`ReplicaFailure`."""
    from starlette.middleware import Middleware

    return [Middleware(ReplicaFailure)]


class CsdgenReplica:
    """One replica: loads the model of ``args`` in this process and serves
    :func:`csdgen.serve.app.create_app`'s app (made a Ray Serve deployment by :func:`application`).

    Args:
        load: ``load(args) -> (ServedModel, capacity, default request)``
            (:func:`csdgen.cli.serve.served_model`), run once in the replica's process.
        args: the parsed ``csdgen serve`` options (an ``argparse.Namespace``).
    """

    def __init__(self, load: Callable, args: Any):
        from csdgen.serve.app import create_app

        self.pid = os.getpid()
        self.replica_id = _replica_id()
        if getattr(args, "log_level", None) is not None:  # csdgen's start-up and access lines, as one server logs them
            import logging.config

            from csdgen.serve.logs import log_config

            logging.config.dictConfig(log_config(args.log_level))
        threads = _use_assigned_cpus()
        served, capacity, _ = load(args)
        self.served, self.capacity = served, capacity
        app = create_app(served, capacity=capacity, max_queue=args.max_queue, batching=args.batching)
        app.add_middleware(_ReplicaHeaders, headers=[(REPLICA_HEADER.encode(), self.replica_id.encode()),
                                                     (PID_HEADER.encode(), str(self.pid).encode())])
        self._app = app
        print(f"csdgen serve: replica {self.replica_id} (pid {self.pid}) serves {served.name} on "
              f"{served.model.device}, max batch {capacity}, torch threads {threads}", flush=True)

    def __serve_build_asgi_app__(self):
        return self._app

    async def check_health(self) -> None:
        """Ray Serve's health check: the app's own ``GET /health`` (200 while the scheduler runs).

        Raises:
            RuntimeError: /health answered another status (Ray then replaces the replica).
        """
        import httpx

        transport = httpx.ASGITransport(app=self._app)
        async with httpx.AsyncClient(transport=transport, base_url="http://replica", timeout=HEALTH_TIMEOUT) as client:
            answer = await client.get("/health")
        if answer.status_code != 200:
            raise RuntimeError(f"replica {self.replica_id} (pid {self.pid}): GET /health answered "
                               f"{answer.status_code} {answer.text}")


def _use_assigned_cpus() -> int:
    """Torch threads = the CPUs Ray assigned this replica (``--replica-cpus``; Ray leaves
    ``OMP_NUM_THREADS`` as the driver's environment had it); outside Ray, unchanged. Returns the count."""
    import torch

    ray = sys.modules.get("ray")
    cpus = None
    if ray is not None and ray.is_initialized():
        try:
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        except Exception:  # a driver, not a worker: nothing assigned
            cpus = None
    if cpus:
        torch.set_num_threads(max(1, int(cpus)))
    return torch.get_num_threads()


def _replica_id() -> str:
    serve = sys.modules.get("ray.serve")  # imported in every replica; absent: not inside one
    try:
        context = serve.get_replica_context()
    except Exception:  # not inside a replica (a unit test constructing the class)
        return f"local-{os.getpid()}"
    rid = getattr(context, "replica_id", None)
    return str(getattr(rid, "unique_id", None) or rid or getattr(context, "replica_tag", os.getpid()))


def gpus_for(args) -> int:
    """GPUs each replica asks Ray for: 1 where the replicas run on CUDA, else 0.

    ``--device cuda``: 1; ``--device cpu``: 0; no ``--device``: 1 when the Ray cluster this
    process is connected to has GPUs (else, Ray not started yet, when torch sees CUDA here).
    """
    if args.device is not None:
        return int(args.device == "cuda")
    import ray

    if ray.is_initialized():
        return int(ray.cluster_resources().get("GPU", 0) >= 1)
    import torch

    return int(torch.cuda.is_available())


def ray_log_level(level: str | None) -> str | None:
    """Ray's log level name for ``--log-level`` (``trace``: ``DEBUG``, Ray has no lower level)."""
    return None if level is None else "DEBUG" if level == "trace" else level.upper()


def deployment_options(args, *, replicas: int = 1, max_replicas: int | None = None, num_cpus: float = 1,
                       num_gpus: int | None = None, target_ongoing_requests: float | None = None,
                       max_ongoing_requests: int | None = None) -> dict:
    """Ray Serve's deployment options for replicas of ``args``' model.

    Args:
        replicas: replicas to run (with ``max_replicas``: the fewest, and the number started).
        max_replicas: ``None``: a fixed number; else Ray Serve autoscales between ``replicas``
            and this by ongoing requests per replica (requests running plus those queued for it).
        num_cpus: CPUs reserved per replica. num_gpus: GPUs per replica (default :func:`gpus_for`).
        target_ongoing_requests: autoscaling's target per replica (default ``args.max_batch``: a
            full batch of one-image requests).
        max_ongoing_requests: most requests a replica holds at once (default ``args.max_batch``);
            more wait in Ray's router, where any replica can take them.

    Raises:
        ValueError: a count out of range, naming it.
    """
    if int(replicas) < 1:
        raise ValueError(f"replicas={replicas!r}: allowed an integer >= 1")
    if max_replicas is not None and int(max_replicas) < int(replicas):
        raise ValueError(f"max_replicas={max_replicas!r}: allowed an integer >= replicas ({replicas})")
    if num_gpus is None:
        num_gpus = gpus_for(args)
    if num_gpus not in (0, 1):
        raise ValueError(f"num_gpus={num_gpus!r}: allowed 0 or 1 (one device per replica)")
    if not float(num_cpus) > 0:
        raise ValueError(f"num_cpus={num_cpus!r}: allowed a number > 0")
    target = float(target_ongoing_requests or args.max_batch)
    options = {"max_ongoing_requests": int(max_ongoing_requests or args.max_batch),
               "ray_actor_options": {"num_cpus": float(num_cpus), "num_gpus": num_gpus},
               "health_check_period_s": 5, "health_check_timeout_s": 30,
               # a replica stopped (scaled down, redeployed) takes no new request and finishes those it holds
               "graceful_shutdown_timeout_s": 60}
    if getattr(args, "log_level", None) is not None:  # Ray Serve's own lines in the replicas (its access lines too)
        options["logging_config"] = {"log_level": ray_log_level(args.log_level)}
    if max_replicas is None:
        options["num_replicas"] = int(replicas)
    else:
        options["autoscaling_config"] = {"min_replicas": int(replicas), "initial_replicas": int(replicas),
                                         "max_replicas": int(max_replicas), "target_ongoing_requests": target}
    return options


def application(load: Callable, args, **options):
    """The Ray Serve application of replicas of ``args``' model (``serve.run`` runs it).

    Args:
        load: what each replica runs to load its model (:func:`csdgen.cli.serve.served_model`).
        args: the parsed ``csdgen serve`` options; a replica given a GPU and no ``--device`` runs on cuda.
        options: :func:`deployment_options`' keywords.

    Raises:
        ValueError: Ray is not installed, or a bad option (naming it).
    """
    serve = _require_ray()
    opts = deployment_options(args, **options)
    if opts["ray_actor_options"]["num_gpus"] and args.device is None:
        args.device = "cuda"  # the GPU Ray gives the replica (CUDA_VISIBLE_DEVICES holds it alone)
    cls = serve.deployment(serve.ingress()(CsdgenReplica), name="CsdgenReplica")
    return cls.options(**opts).bind(load, args)


def run_local(app, host: str, port: int, *, cpus: float, on_ready: Callable[[tuple[str, int]], None] | None = None,
              log_level: str = "info") -> int:
    """Start a local Ray (or join the one ``RAY_ADDRESS`` names) and Serve's HTTP proxy on
    ``host:port``, run ``app`` and wait until Ctrl-C or SIGTERM; then shut Serve and Ray down (a
    cluster it joined: delete this application only and disconnect, so the cluster's other Serve
    applications keep running).

    Args:
        cpus: CPUs the local Ray offers (at least what the replicas reserve).
        on_ready: called with the proxy's ``(host, port)`` once the replicas serve: ``host:port``, or on a
            joined cluster whose Serve already runs, the address its proxy listens on (a note says so).
        log_level: ``csdgen serve --log-level``: of Ray's lines in this process and of Serve's controller and proxy.

    Returns:
        130 after Ctrl-C (SIGINT), 143 after SIGTERM (as one server).

    Raises:
        ValueError: the replicas did not start, naming the last line of a replica's error (Ray logs
            its traceback above); or a joined cluster already runs a Serve application of this name
            (``serve deploy``, another ``csdgen serve --replicas``), which is left as it is.
    """
    import ray
    from ray import serve

    os.environ.setdefault(PROXY_CALLBACK_VARIABLE, PROXY_CALLBACK)  # read by the proxy actor Ray starts
    import logging

    logging.getLogger("ray.serve").setLevel(ray_log_level(log_level))  # Serve's lines in this process
    # Ctrl-C and SIGTERM stop it, also where SIGINT came ignored (a command started with `&`); one that comes
    # while Ray starts is held until ray.init returns, so that the processes it started are stopped too
    stopped_by: list = []
    armed: list = []

    def on_signal(signum, frame):
        _interrupt(signum, stopped_by, armed)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    joined = deployed = False
    try:
        if not ray.is_initialized():
            local = "RAY_ADDRESS" not in os.environ
            joined = not local
            # "local": a Ray of its own, also where `ray start` runs one on this machine (which ray.init would join,
            # refusing num_cpus there)
            try:
                ray.init(address="local" if local else None, num_cpus=max(os.cpu_count() or 1, cpus) if local else None,
                         include_dashboard=False, log_to_driver=True, logging_level=ray_log_level(log_level))
            except ConnectionError as exc:
                if local:
                    raise
                raise ValueError(_join_failure(exc)) from None
            # Ray's core installs a SIGTERM handler of its own in this process, one that aborts it (status 134,
            # Ray's processes left running): ours again, so that SIGTERM stops it all as Ctrl-C does
            for sig in previous:
                signal.signal(sig, on_signal)
        armed.append(True)
        if stopped_by:  # a signal came while Ray started
            raise KeyboardInterrupt
        serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": ray_log_level(log_level)})
        address = (host, port)
        if joined:
            address = _joined_address(serve, host, port)
        deployed = True
        try:
            serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
        except RuntimeError as exc:  # "Deploying application csdgen failed": the replicas did not start
            raise ValueError(f"the replicas did not start: {_replica_failure(serve) or exc}") from None
        if on_ready is not None:
            on_ready(address)
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        print("csdgen serve: stopping the replicas", file=sys.stderr, flush=True)
        return 143 if stopped_by == [signal.SIGTERM] else 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if ray.is_initialized():
            try:
                if not joined:
                    serve.shutdown()
                elif deployed:  # serve.shutdown() would remove every application of the cluster
                    serve.delete(APP_NAME)
            finally:
                ray.shutdown()  # a joined cluster keeps running: this process disconnects


def _join_failure(exc: ConnectionError) -> str:
    """The one line for a cluster ``RAY_ADDRESS`` names that ``ray.init`` could not join (Ray's own message, which
    blames a crashed earlier instance), with the cause Ray 2.60 hides behind it where its lines said
    ``InvalidAuthToken``: a cluster started by ``ray start --head`` asks for its token, which a process sends only
    with ``RAY_AUTH_MODE=token`` (left out where that is set)."""
    message = f"could not join the Ray cluster at RAY_ADDRESS={os.environ.get('RAY_ADDRESS')!r}: {exc}"
    if os.environ.get("RAY_AUTH_MODE") != "token":
        message += ("; where Ray's lines above say InvalidAuthToken, the cluster asks for its token (Ray 2.60's `ray start "
                    "--head` turns that on): set RAY_AUTH_MODE=token; or unset RAY_ADDRESS for a local Ray of this "
                    "command's own")
    return message


def _joined_address(serve, host: str, port: int) -> tuple[str, int]:
    """On a cluster this process joined: refuse where it already runs an application named
    :data:`APP_NAME` (``serve.run`` would replace it, and the stop delete it); the address its Serve
    proxy listens on, with a note where that is not ``host:port`` (a Serve started before keeps its own).

    Raises:
        ValueError: the application is there, naming it and how to remove it.
    """
    if APP_NAME in serve.status().applications:
        raise ValueError(f"the Ray cluster at RAY_ADDRESS={os.environ.get('RAY_ADDRESS')!r} already runs a Serve "
                         f"application named {APP_NAME!r} (serve deploy, or another csdgen serve --replicas); it is left "
                         f"as it is: send requests to it, remove it first (serve delete {APP_NAME}), or unset RAY_ADDRESS "
                         f"for a local Ray of this command's own")
    try:  # Ray's client keeps the HTTP options Serve runs with (no public accessor in Ray 2.60)
        from ray.serve.context import _get_global_client

        config = _get_global_client().http_config
        actual = (str(config.host), int(config.port))
    except Exception:  # another Ray: say the address asked for
        return host, port
    if actual != (host, port):
        print(f"csdgen serve: note: the cluster's Serve proxy already listens on {actual[0]}:{actual[1]}; --host and "
              f"--port do not move it", file=sys.stderr, flush=True)
    return actual


def _replica_failure(serve) -> str | None:
    """The last line of the error that stopped a replica of the application (Serve's status message,
    a traceback), or None when Serve gives none."""
    try:
        application = serve.status().applications[APP_NAME]
        messages = [d.message for d in application.deployments.values()] + [application.message]
    except Exception:  # Serve's controller is gone too: nothing more to say
        return None
    for message in messages:
        lines = [line.strip() for line in str(message or "").splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return None


def _interrupt(signum, stopped_by: list, armed: list):
    if not stopped_by:  # the first signal says how it stopped (a second one, while stopping, changes nothing)
        stopped_by.append(signum)
    if armed:  # else Ray is starting: run_local stops once it has started
        raise KeyboardInterrupt
