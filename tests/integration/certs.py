"""Certificates made at test time with the `openssl` command line (tests that need TLS).

``ca(name, d)`` writes a self-signed CA (``name.pem``, ``name.key``); ``key_and_csr`` a key and a
request for CN=cn; ``sign`` signs that request with a CA, with the given extensions (``ext``, an
openssl extfile's text); ``server_cert`` makes ``ca`` and a ``server`` certificate for
127.0.0.1/localhost. All keys are P-256 EC keys, unencrypted.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

SERVER_EXT = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def key_and_csr(name: str, cn: str, d: Path) -> None:
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)


def ca(name: str, d: Path) -> None:
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
            "-subj", f"/CN={name}", cwd=d)


def sign(name: str, ca: str, ext: str, d: Path) -> None:
    (d / f"{name}.ext").write_text(ext)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
            cwd=d)


def server_cert(d: Path) -> Path:
    """``d/ca.pem`` (and its key) and ``d/server.pem``/``server.key`` signed by it; ``d``."""
    ca("ca", d)
    key_and_csr("server", "localhost", d)
    sign("server", "ca", SERVER_EXT, d)
    return d
