"""Deployment helpers installed as ``fedhop.deploy``: certificates and per-node tokens (``fedhop certs``,
``fedhop tokens``). The Dockerfile and testbed scripts beside them are not Python."""
