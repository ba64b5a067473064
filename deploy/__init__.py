"""Deployment helpers installed as ``fedhop.deploy``: the compose generator, wire-byte counters, the compose
runner; the Dockerfile and base-image script ship beside them as package data."""
