"""The Ray Serve application of ``csdgen serve`` replicas, built from ``csdgen serve`` options.

``serve run csdgen.serve.replicas:app replicas=2 max_batch=16 method=csd`` runs it on a Ray
cluster (a local one when none is running), and a Serve config file deploys it on a cluster
(``serve deploy config.yaml``; docs/serve.md has an example):

.. code-block:: yaml

    applications:
      - name: csdgen
        route_prefix: /
        import_path: csdgen.serve.replicas:app
        args: {replicas: 2, model: path/to/Janus-Pro-7B, max_batch: 16}

:func:`app` takes ``csdgen serve``'s options as keys (``max_batch`` or ``max-batch`` for
``--max-batch``; ``warmup: true`` for a flag) and checks them with the command's own parser,
so a bad value fails at deploy time with the command's one-line message. Replica keys:
``replicas`` (default 1), ``max_replicas`` (autoscaling between the two),
``target_ongoing_requests``, ``max_ongoing_requests``, ``num_cpus`` (per replica, default 1),
``num_gpus`` (0 or 1; default 1 where the cluster has GPUs). :mod:`csdgen.serve.deployment`
holds the replica itself.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

__all__ = ["app", "parse_options", "REPLICA_KEYS"]

#: keys of :func:`app` that shape the deployment (:func:`csdgen.serve.deployment.deployment_options`)
REPLICA_KEYS = {"replicas": int, "max_replicas": int, "target_ongoing_requests": float,
                "max_ongoing_requests": int, "num_cpus": float, "num_gpus": int}
#: csdgen serve options that mean nothing here: Ray Serve's proxy binds the address (serve start's
#: http_options, or the config file's http_options)
IGNORED = ("host", "port", "replica_cpus")


def parse_options(options: dict[str, Any] | None) -> tuple[Any, dict]:
    """``(csdgen serve's parsed options, deployment keywords)`` of an application's args.

    Raises:
        ValueError: an unknown key, a bad value or a value of a flag other than true/false,
            naming it (the command's own message); two keys of one option (``max-batch`` and ``max_batch``).
    """
    from csdgen.cli import build_parser

    words, replica, seen = [], {}, {}
    for key, value in (options or {}).items():
        name = str(key).replace("-", "_")
        if name in seen:  # max-batch=4 max_batch=2: one would win without a word
            raise ValueError(f"{seen[name]}={options[seen[name]]!r} and {key}={value!r} name one option; allowed: "
                             f"one of the two")
        seen[name] = key
        if name in REPLICA_KEYS:
            try:
                replica[name] = None if value is None else REPLICA_KEYS[name](value)
            except (TypeError, ValueError):
                raise ValueError(f"{key}={value!r}: allowed a number ({REPLICA_KEYS[name].__name__})") from None
            continue
        if name in IGNORED:
            raise ValueError(f"{key}={value!r}: the address is Ray Serve's (its http_options); allowed keys: "
                             f"csdgen serve's options and {', '.join(REPLICA_KEYS)}")
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool) or str(value).lower() in ("true", "false"):
            if str(value).lower() == "true":
                words.append(flag)
            continue
        words += [flag, str(value)]
    parser = build_parser()
    message = io.StringIO()
    try:
        with contextlib.redirect_stderr(message):
            args, extra = parser.parse_known_args(["serve", *words])
            if extra:  # named by csdgen serve's own parser, as the command names them
                parser.commands["serve"].error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit:
        text = message.getvalue().strip().splitlines()
        raise ValueError(f"csdgen.serve.replicas:app args {options!r}: {text[-1] if text else 'bad value'}") from None
    return args, replica


def app(options: dict[str, Any] | None = None):
    """The application builder ``serve run csdgen.serve.replicas:app KEY=VALUE ...`` and a Serve
    config's ``import_path`` call: replicas of the model ``options`` describe (module docstring).

    Raises:
        ValueError: a bad option (one line naming it), or Ray is not installed.
    """
    from csdgen.cli.serve import served_model
    from csdgen.serve.deployment import application

    args, replica = parse_options(options)
    return application(served_model, args, **replica)
