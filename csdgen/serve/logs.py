"""The server's log lines, through :mod:`logging` as uvicorn writes its own.

Two loggers:

* ``csdgen.serve``: the start-up line (what is served and how), the shutdown lines (image
  requests not yet answered, queued or decoding, when the server stops, then what it served), and a batch's fault (ERROR, with
  its traceback);
* ``csdgen.serve.access``: one INFO line per ``POST /v1/images/generations`` once it is answered,
  streamed or not, whatever its status::

      127.0.0.1:50132 - "POST /v1/images/generations" 200 method=csd images=4/4 forwards=212 step_compression=1.81 seconds=7.42

  ``images``: images sent / images asked (``n``); ``forwards``: the model forwards of the images
  sent, summed; ``step_compression``: their tokens per forward (tokens / forwards); ``seconds``:
  arrival to answer. A value the request never reached (its body was not valid, its images were
  not decoded) is ``-``. The record also carries the values as attributes (``client_addr``,
  ``status_code``, ``method``, ``images``, ``images_asked``, ``forwards``, ``step_compression``,
  ``seconds``) for a formatter of your own.

:func:`log_config` is uvicorn's logging configuration with these two loggers added: ``csdgen.serve``
writes to stderr as uvicorn's own lines, the access lines go to stdout as uvicorn's access lines
do, both with uvicorn's ``LEVEL:`` prefix; ``csdgen serve --log-level`` sets the level of every
logger (uvicorn's included).
"""

from __future__ import annotations

import copy
import logging
import time

__all__ = ["LOG_LEVELS", "AccessLine", "access_log", "log", "log_config"]

log = logging.getLogger("csdgen.serve")
access_log = logging.getLogger("csdgen.serve.access")

#: ``--log-level`` values (uvicorn's, ``trace`` below ``debug``)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def log_config(level: str = "info") -> dict:
    """The ``logging.config.dictConfig`` dictionary uvicorn gets: its own ``LOGGING_CONFIG`` with
    the ``csdgen.serve`` and ``csdgen.serve.access`` loggers, every logger at ``level``.

    Raises:
        ValueError: ``level`` is not one of :data:`LOG_LEVELS`.
    """
    from uvicorn.config import LOGGING_CONFIG
    from uvicorn.config import LOG_LEVELS as NUMBERS

    if level not in LOG_LEVELS:
        raise ValueError(f"log level {level!r}: allowed {', '.join(LOG_LEVELS)}")
    number = NUMBERS[level]  # a number: "trace" has no name in logging until uvicorn gives it one
    config = copy.deepcopy(LOGGING_CONFIG)
    config["handlers"]["csdgen_access"] = {"formatter": "default", "class": "logging.StreamHandler",
                                           "stream": "ext://sys.stdout"}
    config["loggers"][log.name] = {"handlers": ["default"], "level": number, "propagate": False}
    config["loggers"][access_log.name] = {"handlers": ["csdgen_access"], "level": number, "propagate": False}
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        config["loggers"][name]["level"] = number
    return config


class AccessLine:
    """The access line of one image request, filled in as the request goes and written once.

    Args:
        client: ``(host, port)`` of the client, or ``None``.
        tokens_per_image: the model's image tokens (for the step compression).
    """

    def __init__(self, client, tokens_per_image: int):
        self.client_addr = f"{client[0]}:{client[1]}" if client else "-"
        self.began = time.perf_counter()
        self.tokens_per_image = int(tokens_per_image)
        self.method: str | None = None
        self.images_asked: int | None = None
        self.images = 0
        self.forwards = 0
        self.written = False

    def request(self, request) -> None:
        """The request was checked (:class:`csdgen.serve.schemas.ImageRequest`): its method and ``n``."""
        self.method, self.images_asked = str(request.settings["method"]), int(request.n)

    def image(self, stats) -> None:
        """One image was sent (its :class:`csdgen.ImageStats`)."""
        self.images += 1
        self.forwards += int(stats.steps)

    def write(self, status: int) -> None:
        """Log the line with the answer's HTTP ``status`` (once; later calls do nothing)."""
        if self.written:
            return
        self.written = True
        seconds = time.perf_counter() - self.began
        compression = self.images * self.tokens_per_image / self.forwards if self.forwards else None
        fields = {"client_addr": self.client_addr, "status_code": int(status), "method": self.method,
                  "images": self.images, "images_asked": self.images_asked, "forwards": self.forwards,
                  "step_compression": compression, "seconds": seconds}
        access_log.info('%s - "POST /v1/images/generations" %d method=%s images=%d/%s forwards=%s '
                        'step_compression=%s seconds=%.2f', self.client_addr, int(status), self.method or "-",
                        self.images, "-" if self.images_asked is None else self.images_asked,
                        self.forwards if self.images else "-", "-" if compression is None else f"{compression:.2f}",
                        seconds, extra=fields)
