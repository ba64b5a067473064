"""The PS's web face (issue 10): a live page, a read-only JSON API and Prometheus metrics, served by uvicorn.

    status = RunStatus(); events.subscribe(status)        # the run's RunEvents feed it
    http = start_http(status, "127.0.0.1", 0)              # or http_from_args(args, status)
    ... run ...
    http.stop()
"""

from fedhop.server.web.cli import add_http_args, http_from_args
from fedhop.server.web.serve import HttpConfigError, HttpServer, start_http, stop_http
from fedhop.server.web.status import RunStatus

__all__ = ["HttpConfigError", "HttpServer", "RunStatus", "add_http_args", "http_from_args", "start_http",
           "stop_http"]
