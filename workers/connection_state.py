"""The AMQP connection's state machine as a table (h11's ``_state.py``): its states, the
inputs that move it, and ``(state, input) -> state``.

``AMQPConnection`` (``workers.connection``) applies it; a pair that is not in the table is
``UnexpectedMethod``, naming the state and the input. The states and their names are
RabbitMQ's (rabbit_reader), because the client-visible answer to an error depends on them.
"""

from __future__ import annotations

import enum

from pamqp import commands

from broker import errors


class State(enum.Enum):
    """Connection states, named as RabbitMQ's rabbit_reader names them."""

    HANDSHAKE = "handshake"  # waiting for the protocol header
    STARTING = "starting"  # connection.start sent
    TUNING = "tuning"  # connection.tune sent
    OPENING = "opening"  # tune-ok received, waiting for connection.open
    RUNNING = "running"
    CLOSING = "closing"  # we sent connection.close; waiting for close-ok
    CLOSED = "closed"


class Input(enum.Enum):
    PROTOCOL_HEADER = "protocol header"
    START_OK = "connection.start-ok"
    TUNE_OK = "connection.tune-ok"
    OPEN = "connection.open"
    CLOSE = "connection.close"
    CLOSE_OK = "connection.close-ok"
    UPDATE_SECRET = "connection.update-secret"
    SEND_CLOSE = "server connection.close"
    ABORT = "abort"


TRANSITIONS: dict[tuple[State, Input], State] = {
    (State.HANDSHAKE, Input.PROTOCOL_HEADER): State.STARTING,
    (State.STARTING, Input.START_OK): State.TUNING,
    (State.TUNING, Input.TUNE_OK): State.OPENING,
    (State.OPENING, Input.OPEN): State.RUNNING,
    (State.RUNNING, Input.CLOSE): State.CLOSED,
    (State.RUNNING, Input.UPDATE_SECRET): State.RUNNING,
    (State.CLOSING, Input.CLOSE): State.CLOSED,
    (State.CLOSING, Input.CLOSE_OK): State.CLOSED,
    **{
        (state, Input.SEND_CLOSE): State.CLOSING
        for state in (State.STARTING, State.TUNING, State.OPENING, State.RUNNING)
    },
    **{(state, Input.ABORT): State.CLOSED for state in State if state is not State.CLOSED},
}

METHOD_INPUTS: dict[int, Input] = {
    commands.Connection.StartOk.index: Input.START_OK,
    commands.Connection.TuneOk.index: Input.TUNE_OK,
    commands.Connection.Open.index: Input.OPEN,
    commands.Connection.Close.index: Input.CLOSE,
    commands.Connection.CloseOk.index: Input.CLOSE_OK,
    commands.Connection.UpdateSecret.index: Input.UPDATE_SECRET,
}


class UnexpectedMethod(errors.ChannelError):
    """A (state, input) pair the connection table does not have."""

    def __init__(self, state: State, input_: Input | str, class_id: int, method_id: int) -> None:
        # RabbitMQ's wording; 504 is what rabbit_reader answers.
        super().__init__(
            f"unexpected method in connection state {state.value}", class_id, method_id
        )
        self.state = state
        self.input = input_
