"""The AMQP 0-9-1 connection handshake, server side: what connection.start, start-ok,
tune, tune-ok and open say, checked and answered (AMQP 0-9-1 §4.2.3).

wsproto's model (``handshake.py`` beside ``connection.py``): ``AMQPConnection`` keeps the
state machine and decides when each step may come; the ``Handshake`` holds what the server
offers and what the client chose, and turns each handshake method into the frame that
answers it or an error (``broker.errors``: the connection table decides what the client
hears of it). No IO, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from pamqp import commands

from broker import errors
from workers import codec, sasl
from workers.frame_buffer import FRAME_MIN_SIZE, PROTOCOL_HEADER

# Accepted protocol headers.  RabbitMQ also takes the 0-9 header (AMQP 1 1 0 9)
# as 0-9-1 (rabbit_reader version_negotiation); anything else is refused.
ACCEPTED_PROTOCOL_HEADERS: Final = frozenset((PROTOCOL_HEADER, b"AMQP\x01\x01\x00\x09"))


class Tuned:
    """What tune-ok settled: the connection's frame_max, channel_max and heartbeat."""

    __slots__ = ("channel_max", "frame_max", "heartbeat")

    def __init__(self, frame_max: int, channel_max: int, heartbeat: int) -> None:
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = heartbeat


class Handshake:
    """One connection's handshake: the server's offer, the client's login and choices."""

    def __init__(
        self,
        *,
        server_properties: dict[str, Any],
        frame_max: int,
        channel_max: int,
        heartbeat: int,
        users: Mapping[str, str],
        peer_is_loopback: bool,
        loopback_users: frozenset[str],
        external_user: str | None = None,
    ) -> None:
        self._server_properties = server_properties
        self._frame_max = frame_max
        self._channel_max = channel_max
        self._heartbeat = heartbeat
        # RabbitMQ's loopback_users: these may log in only from a loopback address.
        self._authenticator = sasl.Authenticator(
            users, peer_is_loopback=peer_is_loopback, loopback_users=loopback_users,
            external_user=external_user)
        self.client_properties: dict[str, Any] = {}
        self.user = ""
        self.refused_login: tuple[str, str] | None = None  # (user, why) for the runtime's log
        # The client takes connection.close for a refused login (its capability).
        self.auth_failure_close = False

    def start(self) -> bytes:
        """connection.start, after an accepted protocol header."""
        start = commands.Connection.Start(
            version_major=0,
            version_minor=9,
            server_properties=self._server_properties,
            mechanisms=" ".join(self._authenticator.mechanisms),
            locales="en_US",
        )
        return codec.encode_method(0, start)

    def start_ok(self, method: commands.Connection.StartOk) -> bytes:
        """The client's properties and login; connection.tune. Raises a refused login
        (``sasl.SaslRefusal``) or the start-ok's 503/502."""
        self.client_properties = dict(method.client_properties or {})
        capabilities = self.client_properties.get("capabilities")
        self.auth_failure_close = (
            isinstance(capabilities, dict)
            and capabilities.get("authentication_failure_close") is True
        )
        try:
            self.user = self._authenticator.authenticate(method.mechanism, method.response)
        except sasl.SaslRefusal as exc:
            self.refused_login = (exc.user, exc.why)  # for the runtime's log
            raise
        tune = commands.Connection.Tune(
            channel_max=self._channel_max,
            frame_max=self._frame_max,
            heartbeat=self._heartbeat,
        )
        return codec.encode_method(0, tune)

    def tune_ok(self, method: commands.Connection.TuneOk) -> Tuned:
        """The values tune-ok settles; 530 for one under the protocol's minimum."""
        frame_max = _negotiate("frame_max", method.frame_max, self._frame_max, FRAME_MIN_SIZE)
        channel_max = _negotiate("channel_max", method.channel_max, self._channel_max, 1)
        # RabbitMQ takes the client's heartbeat as is; 0 disables heartbeats.
        return Tuned(frame_max, channel_max, method.heartbeat)

    def open(self, method: commands.Connection.Open,
             exists: Callable[[str], bool] | None = None) -> str:
        """The virtual host connection.open names; 530 for one that does not exist
        (``exists``, the worker's live set; None: only "/")."""
        vhost = method.virtual_host
        if not (exists(vhost) if exists is not None else vhost == "/"):
            raise errors.NotAllowed(f"vhost {vhost} not found", 10, 40)
        return vhost


def _negotiate(name: str, client: int, server: int, minimum: int) -> int:
    """Tune-ok value: the client's when lower and non-zero, else ours."""
    if 0 < client < minimum:
        raise errors.NotAllowed(
            f"negotiated {name} = {client} is lower than the minimum allowed value ({minimum})",
            10,
            30,
        )
    return min(client, server) if client else server
