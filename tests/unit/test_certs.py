"""``fedhop certs init|add`` and ``fedhop tokens init``: the files are read back with ``cryptography`` and the
standard library, independently of the code that wrote them."""

from __future__ import annotations

import datetime as dt
import hmac
import ipaddress
import json
import os
import stat
import tomllib

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from fedhop.cli import main
from fedhop.transport import tokens as tokens_mod
from fedhop.transport.certs import CA, CertError
from fedhop.transport.tokens import check_token, load_tokens

SPEC = "[topology]\nclients = 3\nedges = 1\n"
NODES = ["ps", "edge-0", "client-0", "client-1", "client-2"]  # what that topology holds


@pytest.fixture
def spec(tmp_path):
    p = tmp_path / "spec.toml"
    p.write_text(SPEC)
    return p


@pytest.fixture
def zero_umask():
    """Run with umask 0, so 0600 can only come from the code setting modes itself."""
    old = os.umask(0)
    yield
    os.umask(old)


def cert(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def sans(c: x509.Certificate) -> x509.SubjectAlternativeName:
    return c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


def test_init_writes_a_ca_and_one_certificate_per_node(tmp_path, spec, zero_umask):
    out = tmp_path / "pki"
    assert main(["certs", "init", "--out", str(out), str(spec)]) == 0
    ca = cert(out / "ca.crt")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert sorted(p.name for p in out.glob("*.crt")) == sorted(["ca.crt", *(f"{n}.crt" for n in NODES)])
    assert sorted(p.name for p in out.glob("*.key")) == sorted(f"{n}.key" for n in NODES)
    for n in NODES:
        c = cert(out / f"{n}.crt")
        assert c.issuer == ca.subject
        c.verify_directly_issued_by(ca)  # raises if not signed by this CA
        san = sans(c)
        assert san.get_values_for_type(x509.UniformResourceIdentifier) == [f"fedhop://node/{n}"]
        assert n in san.get_values_for_type(x509.DNSName)
        eku = c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert ExtendedKeyUsageOID.SERVER_AUTH in eku and ExtendedKeyUsageOID.CLIENT_AUTH in eku
        assert c.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
        assert c.extensions.get_extension_for_class(x509.KeyUsage).value.digital_signature
        key = serialization.load_pem_private_key((out / f"{n}.key").read_bytes(), password=None)
        assert key.public_key() == c.public_key()
        assert mode(out / f"{n}.key") == 0o600
        assert mode(out / f"{n}.crt") == 0o644
    # the CA key lives apart from what nodes receive, readable by the owner only
    assert not (out / "ca.key").exists()
    assert mode(out / "ca-private") == 0o700
    assert mode(out / "ca-private" / "ca.key") == 0o600
    ca_key = serialization.load_pem_private_key((out / "ca-private" / "ca.key").read_bytes(), password=None)
    assert ca_key.public_key() == ca.public_key()


def test_listening_roles_carry_loopback_and_host_options_clients_do_not(tmp_path, spec):
    out = tmp_path / "pki"
    rc = main(["certs", "init", "--out", str(out), "--host", "10.1.2.3", "--host", "edge-0=edge0.example.org",
               "--host", "client-1=laptop.lan", str(spec)])
    assert rc == 0
    ps, edge, c0, c1 = (sans(cert(out / f"{n}.crt")) for n in ("ps", "edge-0", "client-0", "client-1"))
    loop = {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
    for listener in (ps, edge):
        assert loop <= set(listener.get_values_for_type(x509.IPAddress))
        assert ipaddress.ip_address("10.1.2.3") in listener.get_values_for_type(x509.IPAddress)
        assert "localhost" in listener.get_values_for_type(x509.DNSName)
    assert "edge0.example.org" in edge.get_values_for_type(x509.DNSName)
    assert "edge0.example.org" not in ps.get_values_for_type(x509.DNSName)
    assert c0.get_values_for_type(x509.DNSName) == ["client-0"]
    assert c0.get_values_for_type(x509.IPAddress) == []
    assert c1.get_values_for_type(x509.DNSName) == ["client-1", "laptop.lan"]


@pytest.mark.parametrize("host, problem", [("0.0.0.0", "wildcard"), ("bad_name!", "neither an IP"),
                                           ("edge-9=x.example", "not in the topology")])
def test_init_rejects_bad_hosts_before_writing(tmp_path, spec, capsys, host, problem):
    out = tmp_path / "pki"
    assert main(["certs", "init", "--out", str(out), "--host", host, str(spec)]) == 2
    assert problem in capsys.readouterr().err
    assert not out.exists()


def test_init_refuses_a_non_empty_folder_unless_forced(tmp_path, spec, capsys):
    out = tmp_path / "pki"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["certs", "init", "--out", str(out), str(spec)]) == 2
    assert "not empty" in capsys.readouterr().err and not (out / "ca.crt").exists()
    assert main(["certs", "init", "--out", str(out), str(spec)] + ["--force"]) == 0
    first = cert(out / "ca.crt").fingerprint(hashes.SHA256())
    assert main(["certs", "init", "--out", str(out), "--force", str(spec)]) == 0
    assert cert(out / "ca.crt").fingerprint(hashes.SHA256()) != first  # a new CA
    assert (out / "notes.txt").read_text() == "mine"


def test_add_issues_from_the_existing_ca_and_refuses_duplicates(tmp_path, spec, capsys, zero_umask):
    out = tmp_path / "pki"
    assert main(["certs", "init", "--out", str(out), str(spec)]) == 0
    assert main(["certs", "add", "--dir", str(out), "--id", "client-7", "--host", "192.168.1.7"]) == 0
    c = cert(out / "client-7.crt")
    c.verify_directly_issued_by(cert(out / "ca.crt"))
    assert sans(c).get_values_for_type(x509.UniformResourceIdentifier) == ["fedhop://node/client-7"]
    assert sans(c).get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("192.168.1.7")]
    assert mode(out / "client-7.key") == 0o600
    before = (out / "client-7.crt").read_bytes()
    assert main(["certs", "add", "--dir", str(out), "--id", "client-7"]) == 2
    assert "already has a certificate" in capsys.readouterr().err
    assert (out / "client-7.crt").read_bytes() == before
    assert main(["certs", "add", "--dir", str(out), "--id", "client-7", "--force"]) == 0
    assert (out / "client-7.crt").read_bytes() != before


def test_add_without_a_ca_or_with_a_bad_id_says_so(tmp_path, capsys):
    assert main(["certs", "add", "--dir", str(tmp_path / "none"), "--id", "client-1"]) == 2
    assert "no CA in" in capsys.readouterr().err
    ca_dir = tmp_path / "pki"
    assert main(["certs", "init", "--out", str(ca_dir)]) == 0
    capsys.readouterr()
    assert main(["certs", "add", "--dir", str(ca_dir), "--id", "Client_1"]) == 2
    assert "cannot name a certificate" in capsys.readouterr().err


def test_validity_days(tmp_path, spec):
    out = tmp_path / "pki"
    assert main(["certs", "init", "--out", str(out), "--days", "10", "--ca-days", "20", str(spec)]) == 0
    c, ca = cert(out / "client-0.crt"), cert(out / "ca.crt")
    life = c.not_valid_after_utc - c.not_valid_before_utc
    assert dt.timedelta(days=10) <= life <= dt.timedelta(days=10, minutes=10)
    assert c.not_valid_before_utc <= dt.datetime.now(dt.UTC) < c.not_valid_after_utc
    assert dt.timedelta(days=20) <= ca.not_valid_after_utc - ca.not_valid_before_utc
    assert main(["certs", "add", "--dir", str(out), "--id", "client-9", "--days", "30"]) == 2  # outlives the CA
    with pytest.raises(SystemExit) as e:
        main(["certs", "init", "--out", str(tmp_path / "x"), "--days", "0"])
    assert e.value.code == 2


def test_an_expired_certificate_can_be_made_for_tests():
    ca = CA.create("test")
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    _, c = ca.issue("client-1", not_before=now - dt.timedelta(days=3), not_after=now - dt.timedelta(days=1))
    assert c.not_valid_after_utc == now - dt.timedelta(days=1)
    assert c.not_valid_after_utc < dt.datetime.now(dt.UTC)
    with pytest.raises(CertError, match="end after it starts"):
        ca.issue("client-1", not_before=now, not_after=now - dt.timedelta(seconds=1))


# -- tokens ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tokens.toml", "tokens.json"])
def test_tokens_init_writes_one_secret_per_node_0600(tmp_path, spec, zero_umask, name):
    path = tmp_path / name
    assert main(["tokens", "init", "--out", str(path), str(spec)]) == 0
    assert mode(path) == 0o600
    raw = path.read_bytes()
    table = (json.loads(raw) if name.endswith(".json") else tomllib.loads(raw.decode()))["tokens"]
    assert sorted(table) == sorted(NODES)
    assert all(len(s) == 64 and int(s, 16) >= 0 for s in table.values())
    assert len(set(table.values())) == len(NODES)
    assert load_tokens(path) == table


def test_tokens_init_keeps_an_existing_file(tmp_path, spec, capsys):
    path = tmp_path / "t.toml"
    path.write_text("precious")
    assert main(["tokens", "init", "--out", str(path), str(spec)]) == 2
    assert "exists" in capsys.readouterr().err and path.read_text() == "precious"


@pytest.mark.parametrize("text, problem", [("x = 1\n", "no non-empty 'tokens' table"),
                                           ('[tokens]\n"client-1" = "short"\n', "hex digits"),
                                           ('[tokens]\n"Bad Id" = "' + "a" * 64 + '"\n', "cannot name"),
                                           ("[tokens\n", "not a valid TOML")])
def test_load_tokens_rejects_bad_files(tmp_path, text, problem):
    path = tmp_path / "t.toml"
    path.write_text(text)
    with pytest.raises(tokens_mod.TokenError, match=problem):
        load_tokens(path)


def test_check_token():
    secret = "ab" * 32
    table = {"client-1": secret, "client-2": "cd" * 32}
    assert check_token(table, f"client-1:{secret}") == "client-1"
    assert check_token(table, f"client-1:{secret}".encode()) == "client-1"
    assert check_token(table, f"client-2:{secret}") is None  # client-1's secret does not prove client-2
    assert check_token(table, f"client-1:{secret[:-1]}0") is None
    assert check_token(table, f"client-9:{secret}") is None
    assert check_token(table, secret) is None
    assert check_token(table, "") is None
    assert check_token(table, None) is None


def test_check_token_compares_in_constant_time_even_for_unknown_ids(monkeypatch):
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(tokens_mod.hmac, "compare_digest", spy)
    table = {"client-1": "ab" * 32}
    check_token(table, "client-1:" + "ab" * 32)
    check_token(table, "client-9:" + "ab" * 32)
    assert calls == [(64, 64), (64, 64)]
