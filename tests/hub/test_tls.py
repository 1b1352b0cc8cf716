"""TLS beside the plain port, with certificates made at test time, on real hub processes."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from hub import errors
from hub.client import HedwigClient, Message
from hub.tls import server_context
from tools.cluster import LocalCluster

in_cluster = pytest.mark.asyncio(loop_scope="module")
CONF = {"bk_ensemble_size": "1", "bk_write_quorum_size": "1", "bk_ack_quorum_size": "1", "zk_timeout": "1000",
        "ssl_enabled": "true", "ssl_handshake_timeout": "500", "rebalance_interval_sec": "0"}
ROOT = Path(__file__).resolve().parents[2]


CA = tuple[ec.EllipticCurvePrivateKey, x509.Certificate, Path]


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(directory: Path, cn: str = "Quire test CA") -> CA:
    """A CA: its key, its certificate and the PEM file of that certificate (what ``ssl_ca_file`` names)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    path = directory / f"{cn.replace(' ', '-')}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert, path


def make_cert(directory: Path, password: str = "s3cret",
              ca: CA | None = None,
              host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A hub certificate for ``host`` (SAN: IP address) signed by ``ca`` (None: self-signed), as PEM
    (cert + key) and as PKCS#12 protected by ``password``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    issuer_key, issuer = (ca[0], ca[1].subject) if ca else (key, _name(host))
    cert = (x509.CertificateBuilder().subject_name(_name(host)).issuer_name(issuer).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]),
                           critical=False)
            .sign(issuer_key, hashes.SHA256()))
    stem = directory / f"hub-{uuid.uuid4().hex[:8]}"
    pem = stem.with_suffix(".pem")
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    p12 = stem.with_suffix(".p12")
    p12.write_bytes(pkcs12.serialize_key_and_certificates(
        b"hub", key, cert, [ca[1]] if ca else None, serialization.BestAvailableEncryption(password.encode())))
    return pem, p12


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CA]:
    """A directory and the CA that signs the test cluster's hub certificates."""
    root = tmp_path_factory.mktemp("tls")
    return root, make_ca(root)


@pytest.fixture(scope="module")
def trusting(pki: tuple[Path, CA]) -> dict[str, str]:
    """The client conf that trusts the cluster's CA."""
    return {"ssl_enabled": "true", "ssl_ca_file": str(pki[1][2])}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(pki: tuple[Path, CA]) -> AsyncIterator[LocalCluster]:
    root, ca = pki
    pem, p12 = make_cert(root, ca=ca)
    async with LocalCluster(bookies=1, hubs=2, data_dir=root / "cluster",
                            conf_overrides={**CONF, "cert_path": str(p12), "password": "s3cret"}) as c:
        c.set_hub_conf(1, cert_path=str(pem), password="")   # hub 1 reads PEM, hub 0 PKCS#12
        await c.stop_hub(1)
        await c.restart_hub(1)
        yield c


async def _round_trip(address: str, conf: dict[str, str] | None = None) -> None:
    topic = uuid.uuid4().hex.encode()
    got: asyncio.Queue[Message] = asyncio.Queue()

    async def handler(t: bytes, s: bytes, m: Message) -> None:
        got.put_nowait(m)

    async with await HedwigClient.connect(address, conf=conf) as c:
        await c.subscribe(topic, b"s")
        await c.start_delivery(topic, b"s", handler)
        assert await c.publish(topic, b"secret body") == 1
        msg = await asyncio.wait_for(got.get(), 20)
        assert msg.body == b"secret body"


@in_cluster
async def test_tls_clients_on_pkcs12_and_pem_hubs(cluster: LocalCluster, trusting: dict[str, str]) -> None:
    for ssl_address in cluster.hub_ssl_addresses:
        assert ssl_address and ssl_address not in cluster.hub_addresses
        await _round_trip(ssl_address, trusting)
    await _round_trip(cluster.hub_addresses[0])      # the plain port still serves


@in_cluster
async def test_redirect_keeps_the_client_on_tls(cluster: LocalCluster, trusting: dict[str, str]) -> None:
    topic = uuid.uuid4().hex.encode()
    ssl_ports = [a.rsplit(":", 1)[1] for a in cluster.hub_ssl_addresses]
    async with await HedwigClient.connect(cluster.hub_ssl_addresses[0], conf=trusting) as c0:
        await c0.publish(topic, b"x")
        owner = ssl_ports.index(c0.owner[topic].rsplit(":", 1)[1])
    other = cluster.hub_ssl_addresses[1 - owner]
    async with await HedwigClient.connect(other, conf=trusting) as c1:
        assert await c1.publish(topic, b"y") == 2     # redirected to the owner ...
        target = c1.owner[topic]
        assert target.count(":") == 2 and target.rsplit(":", 1)[1] == ssl_ports[owner]   # "host:port:sslport"
        conn = c1.conns[target]
        assert conn.transport is not None and conn.transport.get_extra_info("ssl_object") is not None


@in_cluster
async def test_plaintext_client_on_the_tls_port_is_told_so_and_hub_keeps_serving(
        cluster: LocalCluster, trusting: dict[str, str]) -> None:
    with pytest.raises(errors.CouldNotConnectError, match="serves TLS only") as info:
        async with await HedwigClient.connect(cluster.hub_ssl_addresses[0],
                                              conf={"server_ack_response_timeout": "2000"}) as c:
            await c.publish(b"plain", b"x")
    assert "ssl_enabled=true" in str(info.value)
    await _round_trip(cluster.hub_ssl_addresses[0], trusting)


@in_cluster
async def test_tls_client_on_a_plaintext_port_is_told_so(cluster: LocalCluster, trusting: dict[str, str]) -> None:
    with pytest.raises(errors.CouldNotConnectError, match=r"TLS handshake .* failed.*serve TLS"):
        await HedwigClient.connect(cluster.hub_addresses[0], conf=trusting)
    await _round_trip(cluster.hub_addresses[0])      # the plain port still serves


@in_cluster
async def test_client_rejects_a_hub_certificate_signed_by_another_ca(
        cluster: LocalCluster, pki: tuple[Path, CA], caplog: pytest.LogCaptureFixture) -> None:
    other = make_ca(pki[0], cn="Some other CA")
    for conf in ({"ssl_enabled": "true", "ssl_ca_file": str(other[2])},   # a CA that did not sign the hub's
                 {"ssl_enabled": "true"}):                                 # the system's CAs
        with pytest.raises(errors.UntrustedCertificateError, match="certificate is not trusted") as info:
            await HedwigClient.connect(cluster.hub_ssl_addresses[0], conf=conf)
        assert "ssl_ca_file" in str(info.value)
    # the right CA but the wrong name: the hub's certificate is for 127.0.0.1, not "localhost"
    port = cluster.hub_ssl_addresses[0].rsplit(":", 1)[1]
    with pytest.raises(errors.CouldNotConnectError, match=r"not trusted.*(mismatch|match)"):
        await HedwigClient.connect(f"localhost:{port}", conf={"ssl_enabled": "true",
                                                              "ssl_ca_file": str(pki[1][2])})
    # an explicit ssl_verify=false encrypts without checking, and says so in the log
    with caplog.at_level("WARNING", logger="hub.tls"):
        await _round_trip(cluster.hub_ssl_addresses[0], {"ssl_enabled": "true", "ssl_ca_file": str(other[2]),
                                                         "ssl_verify": "false"})
    assert any("ssl_verify=false" in r.getMessage() for r in caplog.records)


@in_cluster
async def test_stalled_handshake_is_dropped_and_hub_keeps_serving(cluster: LocalCluster,
                                                                  trusting: dict[str, str]) -> None:
    host, port = cluster.hub_ssl_addresses[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))   # TCP only: never sends a ClientHello
    try:
        assert await asyncio.wait_for(reader.read(), 10) == b""       # dropped after ssl_handshake_timeout
    finally:
        writer.close()
    await _round_trip(cluster.hub_ssl_addresses[0], trusting)


def test_certificate_errors_are_one_line(tmp_path: Path) -> None:
    pem, p12 = make_cert(tmp_path)
    assert isinstance(server_context(pem), ssl.SSLContext)
    assert isinstance(server_context(p12, "s3cret"), ssl.SSLContext)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    cases = [(tmp_path / "missing.p12", "", "No such file"), (p12, "wrong", "password"),
             (garbage, "", "PEM"), (tmp_path, "", "cert_path")]
    for path, password, needle in cases:
        with pytest.raises(errors.CertificateError, match=needle) as info:
            server_context(path, password)
        assert "\n" not in str(info.value) and str(path) in str(info.value)
    with pytest.raises(errors.CertificateError, match="cert_path"):
        server_context("")


def test_hub_with_a_missing_certificate_exits_with_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.cli", "hub", "--set", "server_port=0", "--set", "ssl_enabled=true",
         "--set", f"cert_path={tmp_path / 'nope.pem'}", "--metastore", f"lmdb://{tmp_path / 'ms'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("quire hub:")]
    assert len(lines) == 1 and "nope.pem" in lines[0] and "No such file" in lines[0]


@pytest.mark.asyncio(loop_scope="function")
async def test_regions_talk_over_tls(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    pem, _ = make_cert(tmp_path, ca=ca)
    async with LocalCluster(bookies=1, hubs=1, regions=["r1", "r2"], data_dir=tmp_path / "c",
                            conf_overrides={**CONF, "cert_path": str(pem), "ssl_ca_file": str(ca[2])}) as c:
        conf_text = (c.region_clusters["r2"].data_dir / "hw_region_client.conf").read_text()
        assert "ssl_enabled=true" in conf_text and c.hub_ssl_addresses[0].rsplit(":", 1)[1] in conf_text
        topic = uuid.uuid4().hex.encode()
        got: asyncio.Queue[Message] = asyncio.Queue()

        async def handler(t: bytes, s: bytes, m: Message) -> None:
            got.put_nowait(m)

        async with await HedwigClient.connect(c.hub_addresses_by_region["r2"][0]) as c2, \
                await HedwigClient.connect(c.hub_addresses_by_region["r1"][0]) as c1:
            await c2.subscribe(topic, b"s", synchronous=True)     # r2's hub subscribes in r1 over TLS
            await c2.start_delivery(topic, b"s", handler)
            await c1.publish(topic, b"across")
            msg = await asyncio.wait_for(got.get(), 30)
            assert (msg.body, msg.src_region) == (b"across", "r1")


@pytest.mark.asyncio(loop_scope="function")
async def test_a_tls_only_hub_opens_no_plaintext_port(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    pem, _ = make_cert(tmp_path, ca=ca)
    async with LocalCluster(bookies=1, hubs=1, data_dir=tmp_path / "c",
                            conf_overrides={**CONF, "cert_path": str(pem), "ssl_only": "true"}) as c:
        assert c.hub_addresses == c.hub_ssl_addresses      # named by its TLS port: the only one
        with pytest.raises(errors.CouldNotConnectError, match="serves TLS only"):
            async with await HedwigClient.connect(c.hub_addresses[0],
                                                  conf={"server_ack_response_timeout": "2000"}) as plain:
                await plain.publish(b"t", b"x")
        await _round_trip(c.hub_addresses[0], {"ssl_enabled": "true", "ssl_ca_file": str(ca[2])})
