"""The command-line side: ``--http HOST:PORT`` and ``--http-token`` for simulate / server / launch / testbed up."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from fedhop.common.exit_codes import ExitCode, Fatal

if TYPE_CHECKING:  # the web stack (starlette, uvicorn) is imported only when a page is served
    from fedhop.server.web.live import LivePage

TOKEN_ENV = "FEDHOP_HTTP_TOKEN"


def _address(text: str) -> str:
    if text.lower() == "off":
        return "off"
    from fedhop.server.web.serve import HttpConfigError, parse_address

    try:
        parse_address(text)
    except HttpConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_http_args(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """Add ``--http`` and ``--http-token``. ``default``: the address served when ``--http`` is not given
    (launch: ``127.0.0.1:0``, a free loopback port); None = off unless asked for."""
    on = f"default: {default} (port 0 = a free port); 'off' = no web face" if default else "default: off"
    parser.add_argument("--http", metavar="HOST:PORT", type=_address, default=default or "off",
                        help=f"serve the live page, JSON API and /metrics on HOST:PORT ({on}); a host "
                        "beyond loopback needs --http-token")
    # the default is read when the page is served (token_of), never here: --help would print the token
    parser.add_argument("--http-token", metavar="TOKEN", default=None,
                        help=f"bearer token every HTTP request must carry (default: ${TOKEN_ENV}); required "
                        "when --http binds beyond loopback; a browser opens http://HOST:PORT/?token=TOKEN once")


def token_of(given: str | None) -> str | None:
    """The bearer token: ``--http-token``'s value, else ``$FEDHOP_HTTP_TOKEN``, else None."""
    return given or os.environ.get(TOKEN_ENV) or None


def page_from_args(address: str, token: str | None = None) -> LivePage:
    """A command's run events with the live page the arguments ask for (``--http off``: the events and their
    RunStatus, no server). Subscribe the run's other listeners (a progress bar) to ``page.events``, hand
    ``page.events`` to the run, ``page.close()`` at the end. A bad setting is a :class:`Fatal` (USAGE; a taken
    address: ADDRESS_IN_USE)."""
    from fedhop.server.web.live import OFF, open_page

    token = token_of(token)
    if address == OFF:
        return open_page(OFF)
    from fedhop.server.web.serve import HttpConfigError

    try:
        return open_page(address, token=token, announce=_stderr)
    except HttpConfigError as e:
        raise Fatal(ExitCode.USAGE, str(e)) from None
    except OSError as e:
        raise Fatal(ExitCode.ADDRESS_IN_USE, f"--http {address}: {e}") from None


def _stderr(line: str) -> None:
    print(f"fedhop: {line}", file=sys.stderr, flush=True)
