"""SASL login for connection.start-ok: PLAIN and AMQPLAIN against the broker's users.

AMQP 0-9-1 §4.2.2 leaves the mechanisms to the server; these are RabbitMQ's defaults, with
its rules and texts: RabbitMQ's loopback_users (guest) only from a loopback address, and one
refusal for an unknown user, a wrong password and a loopback-only user from elsewhere -- the
generic text of rabbit_reader's auth_fail, the reason only in the log (``SaslRefusal.why``).
"""

from __future__ import annotations

from collections.abc import Mapping

from broker import errors
from broker.passwords import DEFAULT_USER, check_password, hashed
from workers import codec

_DECODERS = {"PLAIN": codec.decode_plain_response, "AMQPLAIN": codec.decode_amqplain_response}
MECHANISMS = tuple(_DECODERS)
EXTERNAL = "EXTERNAL"
# Without users given (tests): RabbitMQ's default user, stored as the supervisor stores it.
DEFAULT_USERS = hashed(dict([DEFAULT_USER]))


class SaslRefusal(errors.LoginRefused):
    """A login the SASL check refused, with what the runtime's log says of it (the user and
    why: never on the wire)."""

    def __init__(self, reply_text: str, user: str, why: str) -> None:
        super().__init__(reply_text)
        self.user = user
        self.why = why


def refusal(mechanism: str, user: str, why: str) -> SaslRefusal:
    """RabbitMQ 3.10's answer to every refused login: the same text whatever the reason."""
    return SaslRefusal(
        f"Login was refused using authentication mechanism {mechanism}. "
        "For details see the broker logfile.", user, why)


class Authenticator:
    """The users one connection may log in as (name -> stored password, ``broker.passwords``),
    and from where."""

    __slots__ = ("_external_user", "_loopback_users", "_peer_is_loopback", "_users", "mechanisms")

    def __init__(
        self, users: Mapping[str, str], *, peer_is_loopback: bool, loopback_users: frozenset[str],
        external_user: str | None = None,
    ) -> None:
        # EXTERNAL (RabbitMQ's rabbitmq_auth_mechanism_ssl): a TLS connection whose client
        # certificate was verified logs in as its CN, offered only there.
        self._external_user = external_user
        self.mechanisms = MECHANISMS if external_user is None else (*MECHANISMS, EXTERNAL)
        # The worker's table itself, not a copy: a user added, changed or deleted at runtime
        # (Worker.users_changed) counts for a connection that logs in after the change.
        self._users = users
        self._peer_is_loopback = peer_is_loopback
        self._loopback_users = loopback_users

    def authenticate(self, mechanism: str, response: str | bytes) -> str:
        """The user start-ok's response names; raises SaslRefusal, or 503/502 (start-ok ids)."""
        if mechanism == EXTERNAL and self._external_user is not None:
            return self._external(self._external_user)
        decoder = _DECODERS.get(mechanism)
        if decoder is None:
            raise errors.CommandInvalid(f"unknown authentication mechanism '{mechanism}'", 10, 11)
        raw = response.encode("utf-8") if isinstance(response, str) else bytes(response or b"")
        try:
            user, password = decoder(raw)
        except codec.DecodeError as exc:
            raise errors.SyntaxError_(str(exc), 10, 11) from exc
        if user not in self._users or not check_password(self._users[user], password):
            raise refusal(mechanism, user,
                          "unknown user" if user not in self._users else "invalid credentials")
        if user in self._loopback_users and not self._peer_is_loopback:
            raise refusal(mechanism, user, "can only connect via localhost")
        return user

    def _external(self, user: str) -> str:
        """EXTERNAL: the certificate's CN, which must be a user of the broker (no password);
        the response is not looked at, as in RabbitMQ."""
        if user not in self._users:
            raise refusal(EXTERNAL, user, "unknown user (certificate CN)")
        if user in self._loopback_users and not self._peer_is_loopback:
            raise refusal(EXTERNAL, user, "can only connect via localhost")
        return user
