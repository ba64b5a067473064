"""Deployments beyond one process tree: the network-namespace testbed (``fedhop testbed up``)."""
