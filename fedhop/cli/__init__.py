"""The ``fedhop`` command line (the console script ``fedhop = fedhop.cli:main``; ``python -m fedhop``).

Nothing imports this package but ``fedhop/__main__.py``: the launcher's fork server names its entry point
(``fedhop.forkstart.ENTRY``) instead. The modules:

- ``app``: the parser of every command, and :func:`main`;
- ``console``: what the commands share (help format, spec and run folder options, progress bars, the run's
  summary, the live page, a role process's logging and exit); ``security``: --tls/--token/--insecure;
- ``errors``: every exception a command ends on, mapped to its exit code and one line;
- one module per command group: ``run`` (simulate, launch), ``roles`` (server, edge, client, clients),
  ``spec`` (spec, algorithms; ``spec_fields``: --set and --explain), ``reproduce`` (reproduce, compare),
  ``deploy`` (testbed, compose, compose-run, stack-run, health), ``identity`` (certs, tokens);
- ``netcheck``: the address checks a role makes before it starts.

Importing it imports no torch; each command imports what it runs.
"""

from fedhop.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
