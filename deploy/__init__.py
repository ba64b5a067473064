"""Deployments beyond one process tree, installed as ``fedhop.deploy``: the network-namespace testbed
(``fedhop testbed up``), the compose generator and runner, the swarm runner, wire-byte counters, certificates and
tokens; the Dockerfile and base-image script ship beside them as package data.

Every testbed keeps one contract (contract.py): a plan (node -> address) from the topology, one role command line
(:class:`~fedhop.deploy.contract.RoleCommand`), one process supervisor (processes.py), one kernel-counter
interface (wire.py) and one per-link table (link_table.py), and the start / wait / wire / stop protocol."""
