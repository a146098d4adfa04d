"""The AMQPS listener's TLS settings (``shoal serve --tls-*``), as both sides read them.

The supervisor builds the context once at start only to check the files (a bad path, an
unreadable key or a certificate that does not match it stops ``shoal serve`` with one line),
then drops it: it never holds key material after that. Each worker builds its own from the
same paths (``WorkerConfig.tls_*``): the key's contents never travel in argv, the environment
or a pipe.

RabbitMQ's ``ssl_options``: ``certfile``, ``keyfile``, ``cacertfile``, ``verify``
(``verify_peer``: ask for a client certificate, and refuse one that does not chain to the CA),
``fail_if_no_peer_cert`` (with ``verify_peer``: refuse a client that sends none). TLS 1.2 and
1.3 only: RabbitMQ 3.10 still takes 1.0 and 1.1 unless told otherwise.
"""

from __future__ import annotations

import ssl
from typing import Any


class TLSSettingsError(ValueError):
    """The TLS files cannot make a server context: one line, for ``shoal serve``'s refusal."""


def server_context(
    certfile: str, keyfile: str, cafile: str = "", *, verify_peer: bool = False,
    fail_if_no_peer_cert: bool = False,
) -> ssl.SSLContext:
    """A server-side context for the AMQPS listener; TLSSettingsError names what is wrong."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION
    try:
        context.load_cert_chain(certfile, keyfile or None)
    except FileNotFoundError as exc:
        raise TLSSettingsError(f"{exc.filename or certfile}: no such file") from None
    except PermissionError as exc:
        raise TLSSettingsError(f"{exc.filename or keyfile}: permission denied") from None
    except ssl.SSLError as exc:
        raise TLSSettingsError(
            f"certificate {certfile} and key {keyfile}: cannot be loaded as a pair "
            f"({exc.reason or exc})") from None
    except OSError as exc:
        raise TLSSettingsError(f"{certfile}: {exc.strerror or exc}") from None
    if cafile:
        try:
            context.load_verify_locations(cafile)
        except FileNotFoundError:
            raise TLSSettingsError(f"{cafile}: no such file") from None
        except (ssl.SSLError, OSError) as exc:
            raise TLSSettingsError(f"CA certificates {cafile}: cannot be loaded ({exc})") from None
    if verify_peer:
        if not cafile:
            raise TLSSettingsError("verify_peer needs the CA certificates (--tls-ca)")
        context.verify_mode = ssl.CERT_REQUIRED if fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


def common_name(cert: dict[str, Any] | None) -> str | None:
    """The subject's CN of a verified peer certificate (``SSLSocket.getpeercert()``), the user
    name RabbitMQ's EXTERNAL mechanism logs in as (``ssl_cert_login_from = common_name``)."""
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for name, value in rdn:
            if name == "commonName":
                return str(value)
    return None
