"""The gRPC session runtime every role shares (docs/design.md section 6), split by concern:

* ``channels.py``: the one place that makes gRPC servers and channels (options, limits, credentials);
* ``session/``: the ``Parent.Session`` protocol (Hello/Welcome/Ready/Task/Result/Report/Bye), both sides,
  free of gRPC: the parent's ``ParentHub`` is a façade over admission, calls, liveness and reports, built from
  one frozen ``HubConfig``; ``parent.py`` and ``child.py`` are its gRPC halves (the servicer; dialing, streams,
  re-joins);
* ``inbound.py``: the one validation path for inbound tasks, hand-offs and results;
* ``peer.py``: the edge-to-edge protocol, both halves (``Edge.HandOff`` / ``Edge.Describe``);
* ``netcomm.py``: the networked Comm (scatter, hand-off, describe; round boundaries; nested deadlines);
* ``credentials.py``: a node's :class:`Security` (plaintext, mutual TLS or tokens) for every channel and server;
  ``certs.py`` and ``tokens.py``: the identity material (``fedhop certs`` / ``fedhop tokens``), so the runtime
  never imports the testbeds;
* exit codes: ``common/exit_codes.py`` (one module for every command and role).

Roles import this package and ``common``, never each other; ``common`` stays free of sockets.
"""
