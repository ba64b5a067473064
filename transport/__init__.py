"""The gRPC session runtime every role shares (DESIGN.md section 4).

``parent.py`` is the parent side of ``Parent.Session`` (served by the PS and by every edge) plus the
networked Comm; ``child.py`` is the child side (run by every edge and client). Roles import this package
and ``common``, never each other; ``common`` stays free of sockets.
"""
