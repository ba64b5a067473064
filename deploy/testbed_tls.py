"""``fedhop testbed up --tls DIR|auto``: mutual TLS on every link of the namespace testbed.

Children dial their parent at its testbed address (e.g. ``10.231.0.1:50051``), so the certificates of the
listening roles (the PS, each edge) must name those addresses. ``auto`` makes a throw-away CA and certificates
that do, under the run folder (``RUN/tls``); a folder made by ``fedhop certs init`` is checked before anything
is created, and a certificate that lacks its address is named with the ``certs init`` command that fixes it.
Addresses are the subnet's hosts in node order: the PS first, then the edges, then the clients.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509

from fedhop.deploy.netns import Network, TestbedError

AUTO = "auto"


def host_options(net: Network) -> list[str]:
    """``--host NODE=ADDRESS`` for every listening node (``fedhop certs init`` options)."""
    return [f"--host {n}={nn.address}" for n, nn in net.nodes.items() if nn.role != "client"]


def certs_init_command(spec_path: Path, folder: str, net: Network) -> str:
    return f"fedhop certs init {spec_path} --out {folder} " + " ".join(host_options(net))


def _ip_names(cert_path: Path) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(san.get_values_for_type(x509.IPAddress))


def check_folder(folder: Path, net: Network, spec_path: Path) -> None:
    """Every node's key and certificate are there and each listening node's certificate names its testbed
    address; TestbedError naming what is missing otherwise."""
    from fedhop.transport.certs import CA_CERT, node_files

    fix = f"make one for this testbed with: {certs_init_command(spec_path, str(folder), net)}"
    if not (folder / CA_CERT).is_file():
        raise TestbedError(f"--tls {folder}: no {CA_CERT} there; {fix}")
    missing = [n for n in net.nodes if not all(f.is_file() for f in (node_files(folder, n).cert,
                                                                        node_files(folder, n).key))]
    if missing:
        raise TestbedError(f"--tls {folder}: no certificate or key for {missing}; {fix}")
    unnamed = []
    for n, nn in net.nodes.items():
        if nn.role != "client" and ipaddress.ip_address(nn.address) not in _ip_names(node_files(folder, n).cert):
            unnamed.append(f"{n} ({nn.address})")
    if unnamed:
        raise TestbedError(f"--tls {folder}: the certificates of {', '.join(unnamed)} do not name the testbed "
                           f"address their children dial; {fix}")


def auto_folder(out: Path, net: Network) -> Path:
    """A fresh CA and certificates for every node, naming the testbed addresses, in ``out/tls``."""
    from fedhop.transport.certs import CertError, init_folder

    d = out / "tls"
    hosts = {n: [nn.address] for n, nn in net.nodes.items() if nn.role != "client"}
    try:
        init_folder(d, list(net.nodes), hosts=hosts, force=True)
    except CertError as e:
        raise TestbedError(f"--tls auto: {e}") from None
    return d
