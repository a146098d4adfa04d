"""AMQPS (issue 37): `shoal serve --tls-port` with pika over an SSLContext, beside the plain port.

Certificates are made at test time with the `openssl` command line: a CA, a server certificate
for 127.0.0.1/localhost, client certificates (CN=alice, a user; CN=mallory, not one) and a second
CA with its own CN=alice. One broker asks for client certificates (verify_peer) without
requiring one; a second also requires one (fail_if_no_peer_cert).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.credentials
import pika.exceptions
import pytest

from tests.integration.certs import ca as _ca
from tests.integration.certs import key_and_csr as _key_and_csr
from tests.integration.certs import sign as _sign
from tests.integration.harness import HOST, REPO_ROOT, Broker, finish, start_broker

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")

# How pika reports a refused TLS handshake: its own error, or the ssl module's.
REFUSED = (pika.exceptions.AMQPConnectionError, ssl.SSLError, ConnectionError)
USERS = ("--user", "guest:guest", "--user", "alice:alice-pw")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    _ca("ca", d)
    _ca("other-ca", d)
    _key_and_csr("server", "localhost", d)
    _sign("server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
          "extendedKeyUsage=serverAuth\n", d)
    for name, cn, ca in (("alice", "alice", "ca"), ("mallory", "mallory", "ca"),
                         ("stranger", "alice", "other-ca")):
        _key_and_csr(name, cn, d)
        _sign(name, ca, "extendedKeyUsage=clientAuth\n", d)
    return d


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _tls_args(certs: Path, *more: str) -> list[str]:
    return ["--tls-port", str(_free_port()), "--tls-cert", str(certs / "server.pem"),
            "--tls-key", str(certs / "server.key"), "--tls-ca", str(certs / "ca.pem"),
            "--tls-verify-peer", *more, *USERS]


def _tls_port(broker: Broker) -> int:
    return int(json.loads(broker.ready_file.read_text())["tls_port"])


@pytest.fixture(scope="module")
def tls_broker(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """verify_peer: a client certificate is asked for and checked, not required."""
    instance = start_broker(tmp_path_factory.mktemp("tls-broker"), extra_args=_tls_args(certs))
    try:
        yield instance
    finally:
        finish(instance)


@pytest.fixture(scope="module")
def strict_broker(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """verify_peer and fail_if_no_peer_cert."""
    instance = start_broker(tmp_path_factory.mktemp("strict-broker"),
                            extra_args=_tls_args(certs, "--tls-fail-if-no-peer-cert"))
    try:
        yield instance
    finally:
        finish(instance)


def _context(certs: Path, client: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    if client is not None:
        context.load_cert_chain(str(certs / f"{client}.pem"), str(certs / f"{client}.key"))
    return context


def _connect(broker: Broker, context: ssl.SSLContext,
             credentials: pika.credentials.PlainCredentials | pika.credentials.ExternalCredentials
             | None = None) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host=HOST, port=_tls_port(broker), ssl_options=pika.SSLOptions(context, "localhost"),
        credentials=credentials or pika.PlainCredentials("guest", "guest"),
        connection_attempts=1, socket_timeout=5, blocked_connection_timeout=10))


def _round_trip(connection: pika.BlockingConnection, body: bytes) -> None:
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.confirm_delivery()
    for _ in range(3):
        channel.basic_publish("", queue, body)
    for _ in range(3):
        method, _props, got = channel.basic_get(queue, auto_ack=True)
        assert method is not None and got == body
    received: list[bytes] = []
    channel.basic_publish("", queue, body)

    def on_message(ch: object, method: object, props: object, got: bytes) -> None:
        received.append(got)
        channel.stop_consuming()

    channel.basic_consume(queue, on_message, auto_ack=True)
    channel.start_consuming()
    assert received == [body]


def test_publish_and_consume_over_tls_beside_the_plain_port(tls_broker: Broker, certs: Path) -> None:
    """Small and 256 KiB bodies over TLS (no client certificate: verify_peer alone asks for
    none), and the plain port keeps working alongside."""
    tls = _connect(tls_broker, _context(certs))
    try:
        _round_trip(tls, b"over tls")
        _round_trip(tls, bytes(range(256)) * 1024)
        plain = pika.BlockingConnection(pika.URLParameters(tls_broker.url))
        try:
            _round_trip(plain, b"plain beside tls")
        finally:
            plain.close()
    finally:
        tls.close()


def test_a_stream_of_big_and_small_messages_arrives_whole_and_in_order(tls_broker: Broker,
                                                                     certs: Path) -> None:
    """Bodies bigger than the socket buffers (received into their arena blocks) mixed with
    small ones, published and consumed over TLS at once: every one arrives, in order, intact."""
    bodies = [os.urandom(4 << 20), *(os.urandom(64 << 10) for _ in range(40)),
              *(i.to_bytes(4, "big") * 32 for i in range(2000))]
    publisher = _connect(tls_broker, _context(certs))
    consumer = _connect(tls_broker, _context(certs))
    try:
        channel = consumer.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_qos(prefetch_count=50)
        out = publisher.channel()
        out.confirm_delivery()
        for body in bodies:
            out.basic_publish("", queue, body)
        received: list[bytes] = []
        for method, _props, body in channel.consume(queue, inactivity_timeout=30):
            assert method is not None, f"{len(received)} of {len(bodies)} came"
            received.append(body)
            channel.basic_ack(method.delivery_tag)
            if len(received) == len(bodies):
                break
        assert received == bodies
    finally:
        publisher.close()
        consumer.close()


def test_tls_1_2_and_1_3_are_taken(tls_broker: Broker, certs: Path) -> None:
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        context = _context(certs)
        context.minimum_version = context.maximum_version = version
        connection = _connect(tls_broker, context)
        connection.close()


def _tls_1_1_context(certs: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(str(certs / "ca.pem"))
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    context.minimum_version = context.maximum_version = ssl.TLSVersion.TLSv1_1
    return context


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def _local_openssl_does_tls_1_1(certs: Path) -> bool:
    """Whether this OpenSSL lets a client and a server speak TLS 1.1 at all (in memory)."""
    try:
        client_ctx = _tls_1_1_context(certs)
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
        server_ctx.minimum_version = ssl.TLSVersion.TLSv1_1
        server_ctx.load_cert_chain(str(certs / "server.pem"), str(certs / "server.key"))
    except (ssl.SSLError, ValueError):
        return False
    bios = [ssl.MemoryBIO() for _ in range(4)]
    client = client_ctx.wrap_bio(bios[0], bios[1], server_hostname="localhost")
    server = server_ctx.wrap_bio(bios[2], bios[3], server_side=True)
    for _ in range(10):
        done = 0
        for side in (client, server):
            try:
                side.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError:
                return False
        bios[2].write(bios[1].read())
        bios[0].write(bios[3].read())
        if done == 2:
            return client.version() == "TLSv1.1"
    return False


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_tls_1_1_is_refused(tls_broker: Broker, certs: Path) -> None:
    if not _local_openssl_does_tls_1_1(certs):
        pytest.skip("this OpenSSL does not let a client offer TLS 1.1")
    with pytest.raises(REFUSED):
        _connect(tls_broker, _tls_1_1_context(certs))


def test_a_certificate_from_another_ca_is_refused(tls_broker: Broker, certs: Path) -> None:
    with pytest.raises(REFUSED):
        _connect(tls_broker, _context(certs, "stranger"))


def test_external_logs_in_as_the_certificate_cn(tls_broker: Broker, certs: Path) -> None:
    connection = _connect(tls_broker, _context(certs, "alice"),
                          pika.credentials.ExternalCredentials())
    try:
        _round_trip(connection, b"as alice")
    finally:
        connection.close()


def test_external_with_an_unknown_cn_is_refused(tls_broker: Broker, certs: Path) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as caught:
        _connect(tls_broker, _context(certs, "mallory"), pika.credentials.ExternalCredentials())
    assert "EXTERNAL" in str(caught.value)


def test_external_is_not_offered_without_a_certificate(tls_broker: Broker, certs: Path) -> None:
    """pika refuses to log in when the server does not offer the mechanism it asks for."""
    with pytest.raises(REFUSED):
        _connect(tls_broker, _context(certs), pika.credentials.ExternalCredentials())


def test_fail_if_no_peer_cert_refuses_a_client_without_one(strict_broker: Broker,
                                                           certs: Path) -> None:
    with pytest.raises(REFUSED):
        _connect(strict_broker, _context(certs))
    with pytest.raises(REFUSED):
        _connect(strict_broker, _context(certs, "stranger"))
    connection = _connect(strict_broker, _context(certs, "alice"),
                          pika.PlainCredentials("alice", "alice-pw"))
    try:
        _round_trip(connection, b"with a certificate")
    finally:
        connection.close()


@pytest.mark.parametrize("what", ["no cert", "mismatched key"])
def test_bad_tls_files_stop_serve_with_one_line(certs: Path, tmp_path: Path, what: str) -> None:
    key = certs / ("alice.key" if what == "mismatched key" else "server.key")
    cert = certs / ("server.pem" if what == "mismatched key" else "missing.pem")
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "serve", "--port", "0", "--management-port", "0",
         "--data-dir", str(tmp_path / "data"), "--log-level", "error",
         "--control-socket", str(tmp_path / "c.sock"), "--workers", "1",
         "--tls-port", str(_free_port()), "--tls-cert", str(cert), "--tls-key", str(key)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert "cannot start: TLS:" in lines[0]
    assert str(cert if what == "no cert" else key) in lines[0]
    assert "BEGIN" not in lines[0]
