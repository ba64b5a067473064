"""The session protocol of ``Parent.Session`` (docs/design.md section 6), free of gRPC plumbing.

Parent side (:class:`ParentHub`, one per PS or edge, ``hub.py``), per child session (:class:`ChildLink`)::

    Hello -> checks (protocol, identity, role, late join, run) -> Welcome (the RunSpec)     admission.py, checks.py
    Ready (data sizes) -> the child is ready; admitted to calls at the next round boundary  admission.py
    Task ... Result     (calls: :meth:`ParentHub.call`)                                      calls.py
    Report              (byte-meter rows and missing entries since the last one; merged)     reports.py
    Bye (finished?) -> the child's Bye (what it has not reported) -> close                  reports.py
    handshake timeout, keep-alives, lost sessions, silent children dropped                  liveness.py

A hub is built from one frozen :class:`HubConfig` and tells its node what happens through one
:class:`HubListener`; an edge serves a :class:`PendingHub` until it knows its run (``pending.py``).
Child side (:class:`ChildProtocol`, ``child_side.py``): Welcome / Ready / Task / Bye handling and the task
worker; the gRPC streams, dialing and re-joining are ``transport/child.py``'s, the servicer is
``transport/parent.py``'s.
"""

from fedhop.transport.session.calls import Call, CallTable
from fedhop.transport.session.child_side import ChildProtocol, TaskHooks, child_assembler, hello_frame
from fedhop.transport.session.config import QUIET, HubConfig, HubListener
from fedhop.transport.session.hub import ParentHub
from fedhop.transport.session.link import CLOSE, ROLE_NAMES, ROLES, ChildLink, Frame, Roster
from fedhop.transport.session.pending import RUN_WAIT_S, PendingHub

__all__ = [
    "CLOSE", "QUIET", "ROLES", "ROLE_NAMES", "RUN_WAIT_S", "Call", "CallTable", "ChildLink", "ChildProtocol",
    "Frame", "HubConfig", "HubListener", "ParentHub", "PendingHub", "Roster", "TaskHooks", "child_assembler",
    "hello_frame",
]
