"""Users with RabbitMQ's sha512 and md5 password hashes (rabbit_password_hashing_*): imported
from definitions or given to PUT /api/users, they log in with pika; new passwords are sha256."""

from __future__ import annotations

import base64
import hashlib
import os

import pika
import pika.exceptions
import pytest

from tests.integration.harness import HOST, Broker
from tests.integration.management_helpers import HTTP, managed

__all__ = ["managed"]

SHA256, SHA512, MD5 = (f"rabbit_password_hashing_{d}" for d in ("sha256", "sha512", "md5"))


def rabbitmq_hash(digest: str, password: str) -> str:
    """As rabbit_password:hash/2 makes it: a random 4-byte salt ++ hash(salt ++ password)."""
    salt = os.urandom(4)
    return base64.b64encode(salt + hashlib.new(digest, salt + password.encode()).digest()).decode()


def _logs_in(broker: Broker, user: str, password: str) -> bool:
    try:
        connection = pika.BlockingConnection(pika.ConnectionParameters(
            HOST, broker.port, credentials=pika.PlainCredentials(user, password),
            connection_attempts=1, socket_timeout=10))
    except pika.exceptions.ProbableAuthenticationError:
        return False
    connection.close()
    return True


def _user(name: str, digest: str, **more: str) -> dict[str, str]:
    return {"name": name, "password_hash": rabbitmq_hash(digest, f"{name}-pw"), "tags": "", **more}


def _grant(name: str) -> dict[str, str]:
    return {"user": name, "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}


def _import(http: HTTP, body: dict[str, object]) -> None:
    status, _, answer = http.request("POST", "/api/definitions", body)
    assert status in (200, 201, 204), (status, answer)


@pytest.mark.parametrize("style", ["per user (3.10 export)", "top-level key", "3.5 file"])
def test_imported_sha512_and_md5_users_log_in(managed: tuple[Broker, int], style: str) -> None:
    """A users' hashing_algorithm (RabbitMQ 3.10's export), the file's top-level one, or a file of
    RabbitMQ 3.0-3.5 without one (md5, as RabbitMQ reads it): each user logs in with its password,
    not with another, and the export names its algorithm."""
    broker, port = managed
    http = HTTP(port)
    tag = style.split()[0].replace("-", "")
    if style.startswith("per user"):
        users = [_user(f"{tag}-sha512", "sha512", hashing_algorithm=SHA512),
                 _user(f"{tag}-md5", "md5", hashing_algorithm=MD5)]
        body: dict[str, object] = {"rabbitmq_version": "3.10.8", "users": users}
    elif style == "top-level key":
        users = [_user(f"{tag}-sha512", "sha512")]
        body = {"rabbitmq_version": "3.10.8", "hashing_algorithm": SHA512, "users": users}
    else:
        users = [_user(f"{tag}-md5", "md5")]
        body = {"rabbit_version": "3.5.7", "users": users}
    body["permissions"] = [_grant(u["name"]) for u in users]
    _import(http, body)
    exported = {u["name"]: u for u in http.get("/api/definitions")["users"]}
    for u in users:
        name = u["name"]
        assert _logs_in(broker, name, f"{name}-pw"), name
        assert not _logs_in(broker, name, "guest"), name
        expected = SHA512 if name.endswith("sha512") else MD5
        assert exported[name]["hashing_algorithm"] == expected
        assert exported[name]["password_hash"] == u["password_hash"]


def test_put_user_takes_a_hash_with_its_algorithm_and_a_new_password_is_sha256(
        managed: tuple[Broker, int]) -> None:
    """PUT /api/users/NAME with password_hash and hashing_algorithm (sha512, md5): the user logs
    in; a password set later is stored as sha256; a hash that is not of the named algorithm, or
    an algorithm RabbitMQ does not have, is 400."""
    broker, port = managed
    http = HTTP(port)
    for digest, algorithm in (("sha512", SHA512), ("md5", MD5)):
        name = f"put-{digest}"
        body = {"password_hash": rabbitmq_hash(digest, "pw-" + digest),
                "hashing_algorithm": algorithm, "tags": ""}
        assert http.request("PUT", f"/api/users/{name}", body)[0] == 201
        assert http.request("PUT", f"/api/permissions/%2F/{name}", _grant(name))[0] in (201, 204)
        assert http.get(f"/api/users/{name}")["hashing_algorithm"] == algorithm
        assert _logs_in(broker, name, "pw-" + digest)
        assert http.request("PUT", f"/api/users/{name}", {"password": "fresh", "tags": ""})[0] == 204
        assert http.get(f"/api/users/{name}")["hashing_algorithm"] == SHA256
        assert _logs_in(broker, name, "fresh") and not _logs_in(broker, name, "pw-" + digest)
    wrong = {"password_hash": rabbitmq_hash("sha512", "x"), "hashing_algorithm": MD5, "tags": ""}
    assert http.request("PUT", "/api/users/put-wrong", wrong)[0] == 400
    unknown = {**wrong, "hashing_algorithm": "rabbit_password_hashing_sha3"}
    assert http.request("PUT", "/api/users/put-wrong", unknown)[0] == 400
    assert http.request("GET", "/api/users/put-wrong")[0] == 404
