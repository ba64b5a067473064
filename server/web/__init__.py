"""The PS's web face (issue 10): a live page, a read-only JSON API and Prometheus metrics, served by uvicorn.

    status = RunStatus(); events.subscribe(status)        # the run's RunEvents feed it
    http = start_http(status, "127.0.0.1", 0)              # or http_from_args(args, status)
    ... run ...
    http.stop()

Import from the submodules (``status``, ``serve``, ``cli``): this package imports nothing, so that a command
that only adds ``--http`` to its parser does not load starlette and uvicorn.
"""
