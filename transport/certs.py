"""A small PKI for a federation: one CA and one key + certificate per node (``fedhop certs init|add``).

Every certificate names its node in its subject alternative name twice: as the URI ``fedhop://node/<id>``
(what :func:`node_id_of` reads, and what ``transport/credentials.py`` takes as the peer's verified identity)
and as the DNS name ``<id>`` (so a dialer can pin the peer it expects with ``grpc.ssl_target_name_override``,
and docker service names that equal node ids work). Certificates of listening roles (the PS, edges) also
carry the names and addresses peers dial them at: ``localhost``, ``127.0.0.1``, ``::1`` and any ``--host``.
Every node certificate is valid for both TLS server and client authentication (an edge is both).

Layout of a certificate folder (what ``--tls DIR`` reads)::

    DIR/ca.crt                 the CA certificate: every node needs it
    DIR/<id>.crt, DIR/<id>.key the node's certificate and private key (0600); copy only these to a node
    DIR/ca-private/ca.key      the CA's private key (0600, folder 0700): it signs new nodes
                               (``certs add``) and never leaves the machine that ran ``certs init``

Keys are ECDSA P-256, certificates are signed with SHA-256.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import secrets
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.crt"
CA_PRIVATE_DIR = "ca-private"
CA_KEY = f"{CA_PRIVATE_DIR}/ca.key"
URI_PREFIX = "fedhop://node/"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
DEFAULT_DAYS = 365
DEFAULT_CA_DAYS = 3650
_CLOCK_SKEW = dt.timedelta(minutes=5)  # not_before is backdated this much, for peers whose clocks lag
_NODE_ID = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_DNS_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


class CertError(ValueError):
    """A certificate folder or request that cannot be used; the message names the file or option."""


@dataclass(frozen=True)
class NodeFiles:
    """Where a node's certificate and key live in a certificate folder."""

    cert: Path
    key: Path


def node_files(folder: str | os.PathLike, node_id: str) -> NodeFiles:
    d = Path(folder)
    return NodeFiles(cert=d / f"{node_id}.crt", key=d / f"{node_id}.key")


def check_node_id(node_id: str) -> str:
    """A node id usable in a certificate: a DNS label in lower case (``ps``, ``edge-0``, ``client-12``)."""
    if not isinstance(node_id, str) or not _NODE_ID.fullmatch(node_id):
        raise CertError(f"node id {node_id!r} cannot name a certificate: use lower-case letters, digits and "
                        f"inner hyphens, at most 63 characters (e.g. ps, edge-0, client-3)")
    return node_id


def is_listening_role(node_id: str) -> bool:
    """Clients only dial out; the PS and edges also serve, so their certificates carry listen names."""
    return not node_id.startswith("client-")


def default_hosts(node_id: str) -> list[str]:
    """The names a node's certificate carries without ``--host``: its id, plus loopback for a listening role."""
    return [node_id, *(LOOPBACK_HOSTS if is_listening_role(node_id) else ())]


def _general_name(host: str) -> x509.GeneralName:
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        labels = host.split(".")
        if not host or len(host) > 253 or not all(_DNS_LABEL.fullmatch(lab) for lab in labels):
            raise CertError(f"host {host!r} is neither an IP address nor a DNS name") from None
        return x509.DNSName(host.lower())
    if ip.is_unspecified:
        raise CertError(f"host {host!r} is a wildcard listen address, not one that peers dial: give the "
                        f"machine's address or name instead")
    return x509.IPAddress(ip)


def _names(node_id: str, hosts: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = [x509.UniformResourceIdentifier(URI_PREFIX + node_id)]
    for h in [*default_hosts(node_id), *hosts]:
        name = _general_name(h)
        if name not in out:
            out.append(name)
    return out


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _window(days: int, not_before: dt.datetime | None, not_after: dt.datetime | None,
            ) -> tuple[dt.datetime, dt.datetime]:
    if not isinstance(days, int) or isinstance(days, bool) or days < 1:
        raise CertError(f"validity must be a whole number of days >= 1, got {days!r}")
    start = not_before or _now() - _CLOCK_SKEW
    end = not_after or start + _CLOCK_SKEW + dt.timedelta(days=days)
    if end <= start:
        raise CertError(f"a certificate must end after it starts (not_before {start}, not_after {end})")
    return start, end


@dataclass(frozen=True)
class CA:
    """The CA's private key and certificate."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, name: str = "fedhop", days: int = DEFAULT_CA_DAYS) -> CA:
        key = ec.generate_private_key(ec.SECP256R1())
        start, end = _window(days, None, None)
        subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedhop"),
                             # a random tag keeps two federations' CAs apart even with the same name
                             x509.NameAttribute(NameOID.COMMON_NAME,
                                                f"fedhop CA {secrets.token_hex(4)} ({name})"[:64])])
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    @classmethod
    def load(cls, folder: str | os.PathLike) -> CA:
        """The CA of a certificate folder made by ``fedhop certs init``."""
        d = Path(folder)
        cert_path, key_path = d / CA_CERT, d / CA_KEY
        for p in (cert_path, key_path):
            if not p.is_file():
                raise CertError(f"no CA in {d}: {p} is missing (create one with `fedhop certs init --out {d}`; "
                                f"certs add needs the folder where init ran, the one holding {CA_KEY})")
        try:
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except ValueError as e:
            raise CertError(f"cannot read the CA in {d}: {e}") from e
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
            raise CertError(f"{key_path} is not the private key of {cert_path}")
        return cls(key, cert)

    def issue(self, node_id: str, hosts: Sequence[str] = (), *, days: int = DEFAULT_DAYS,
              not_before: dt.datetime | None = None, not_after: dt.datetime | None = None,
              ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        """A new key and a certificate for ``node_id``, valid ``days`` from now (or exactly
        [``not_before``, ``not_after``], e.g. an already expired one for tests)."""
        check_node_id(node_id)
        start, end = _window(days, not_before, not_after)
        if end > self.cert.not_valid_after_utc:
            raise CertError(f"{node_id}'s certificate would outlive the CA (CA valid until "
                            f"{self.cert.not_valid_after_utc:%Y-%m-%d}); ask for fewer days")
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedhop"),
                             x509.NameAttribute(NameOID.COMMON_NAME, node_id)])
        ca_ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(_names(node_id, hosts)), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return key, cert


def node_id_of(cert: x509.Certificate) -> str | None:
    """The node a certificate names: its one ``fedhop://node/<id>`` URI SAN (None if it has none or several)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    ids = [u[len(URI_PREFIX):] for u in san.get_values_for_type(x509.UniformResourceIdentifier)
           if u.startswith(URI_PREFIX)]
    return ids[0] if len(ids) == 1 and _NODE_ID.fullmatch(ids[0]) else None


# -- files ---------------------------------------------------------------------------------------------------


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` atomically with exactly ``mode`` whatever the umask (fchmod, then rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    write_file(path, pem, 0o600)


def write_cert(path: Path, cert: x509.Certificate) -> None:
    write_file(path, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _mkdir(path: Path, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)


def _hosts_for(node_id: str, hosts: Mapping[str, Sequence[str]]) -> list[str]:
    return [*hosts.get("*", ()), *hosts.get(node_id, ())] if is_listening_role(node_id) else [
        *hosts.get(node_id, ())]


def init_folder(out: str | os.PathLike, node_ids: Sequence[str], *, hosts: Mapping[str, Sequence[str]] | None = None,
                days: int = DEFAULT_DAYS, ca_days: int = DEFAULT_CA_DAYS, ca_name: str = "fedhop",
                force: bool = False) -> list[NodeFiles]:
    """Create a CA and one key + certificate per node in ``out`` (layout: module docstring).

    ``hosts`` maps a node id to extra names/addresses for its certificate; the key ``"*"`` applies to every
    listening role (PS, edges). ``out`` must be new or empty unless ``force`` (then files are replaced).
    """
    d = Path(out)
    hosts = dict(hosts or {})
    ids = [check_node_id(n) for n in node_ids]
    if len(set(ids)) != len(ids):
        raise CertError(f"duplicate node ids in {ids}")
    unknown = sorted(set(hosts) - {"*", *ids})
    if unknown:
        raise CertError(f"--host names nodes that are not in the topology: {unknown} (nodes: {ids})")
    if d.exists() and not d.is_dir():
        raise CertError(f"{d} exists and is not a folder")
    if d.is_dir() and any(d.iterdir()) and not force:
        raise CertError(f"{d} exists and is not empty: choose a new folder, or pass --force to replace its CA "
                        f"and node files (certificates issued from the old CA stop being trusted)")
    for n in ids:  # validate every name before writing anything
        _names(n, _hosts_for(n, hosts))
    _window(days, None, None)
    ca = CA.create(ca_name, ca_days)
    if ca.cert.not_valid_after_utc < _now() + dt.timedelta(days=days):
        raise CertError(f"--days {days} exceeds the CA's validity (--ca-days {ca_days})")
    _mkdir(d, 0o755)
    _mkdir(d / CA_PRIVATE_DIR, 0o700)
    write_key(d / CA_KEY, ca.key)
    write_cert(d / CA_CERT, ca.cert)
    return [_write_node(d, ca, n, _hosts_for(n, hosts), days) for n in ids]


def add_node(folder: str | os.PathLike, node_id: str, *, hosts: Sequence[str] = (), days: int = DEFAULT_DAYS,
             force: bool = False) -> NodeFiles:
    """Issue one more node certificate from the CA of ``folder``; refuses an id already issued unless ``force``."""
    d = Path(folder)
    check_node_id(node_id)
    ca = CA.load(d)
    files = node_files(d, node_id)
    if (files.cert.exists() or files.key.exists()) and not force:
        raise CertError(f"{node_id} already has a certificate in {d} ({files.cert.name}); pass --force to "
                        f"replace it (the old one stays valid until it expires: there is no revocation)")
    _names(node_id, hosts)
    return _write_node(d, ca, node_id, hosts, days)


def _write_node(d: Path, ca: CA, node_id: str, hosts: Sequence[str], days: int) -> NodeFiles:
    key, cert = ca.issue(node_id, hosts, days=days)
    files = node_files(d, node_id)
    write_key(files.key, key)
    write_cert(files.cert, cert)
    return files


def parse_host_options(values: Iterable[str]) -> dict[str, list[str]]:
    """``--host NAME`` (every listening role) and ``--host NODE=NAME`` (one node) as :func:`init_folder`'s map."""
    out: dict[str, list[str]] = {}
    for v in values:
        node, sep, host = v.partition("=")
        if not sep:
            node, host = "*", v
        elif not node or not host:
            raise CertError(f"--host {v!r}: expected NAME or NODE=NAME")
        out.setdefault(node, []).append(host)
    return out
