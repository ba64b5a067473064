"""Deployments beyond one process tree, installed as ``fedhop.deploy``: the network-namespace testbed
(``fedhop testbed up``), the compose generator and runner, wire-byte counters, certificates and tokens; the
Dockerfile and base-image script ship beside them as package data."""
