"""The PS's web face (issue 10): a live page, a read-only JSON API and Prometheus metrics, served by uvicorn.

    with live_page("127.0.0.1:0") as page:        # live.py: a RunStatus fed by page.events, served
        result = simulate(spec, page.events)       # or run_server(..., events=page.events): any engine's Run
    page = page_from_args(address, token)          # cli.py: the same, failures as exit codes

Import from the submodules (``live``, ``status``, ``serve``, ``cli``): this package imports nothing, so that a
command that only adds ``--http`` to its parser does not load starlette and uvicorn.
"""
