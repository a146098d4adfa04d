"""AMQP 0-9-1 errors raised by the domain and turned into frames in one place by the runtime.

Soft errors close the channel (channel.close), hard errors close the connection
(connection.close) -- AMQP 0-9-1 §1.2 "Constants" and pamqp.exceptions carry the same table.
The reply text is the explanation only; RabbitMQ sends ``"<REPLY_NAME> - <text>"`` on the
wire, which :attr:`AMQPError.frame_text` builds.

Called from: the supervisor process (the domain raises, ``broker.runtime.dispatch`` catches
``AMQPError`` -- never bare ``Exception`` -- and answers the worker) and the worker processes
(``workers/`` raises the same classes; ``AMQPConnection.handle_error`` turns them into frames,
and ``error_for_code`` rebuilds the supervisor's ``Error`` records).
"""

from __future__ import annotations

from typing import ClassVar


class AMQPError(Exception):
    """An AMQP reply code with its explanation; ``hard`` picks connection.close over channel.close."""

    reply_code: ClassVar[int] = 541
    reply_name: ClassVar[str] = "INTERNAL_ERROR"
    hard: ClassVar[bool] = True

    def __init__(self, reply_text: str, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(reply_text)
        self.reply_text = reply_text
        # The method that failed; 0 lets the runtime fill in the request it was handling.
        self.class_id = class_id
        self.method_id = method_id

    @property
    def frame_text(self) -> str:
        """The reply-text RabbitMQ puts in channel.close / connection.close."""
        return f"{self.reply_name} - {self.reply_text}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reply_code}, {self.reply_text!r})"


class _Soft(AMQPError):
    hard = False


# --- soft errors: channel.close ------------------------------------------------------------


class ContentTooLarge(_Soft):
    reply_code = 311
    reply_name = "CONTENT_TOO_LARGE"


class NoConsumers(_Soft):
    reply_code = 313
    reply_name = "NO_CONSUMERS"


class AccessRefused(_Soft):
    reply_code = 403
    reply_name = "ACCESS_REFUSED"


class LoginRefused(AccessRefused):
    """403 during the handshake: a refused login closes the connection (rabbit_reader)."""

    hard = True


class NotFound(_Soft):
    reply_code = 404
    reply_name = "NOT_FOUND"


class ResourceLocked(_Soft):
    reply_code = 405
    reply_name = "RESOURCE_LOCKED"


class PreconditionFailed(_Soft):
    reply_code = 406
    reply_name = "PRECONDITION_FAILED"


# --- hard errors: connection.close ---------------------------------------------------------


class ConnectionForced(AMQPError):
    reply_code = 320
    reply_name = "CONNECTION_FORCED"


class InvalidPath(AMQPError):
    reply_code = 402
    reply_name = "INVALID_PATH"


class FrameError(AMQPError):
    reply_code = 501
    reply_name = "FRAME_ERROR"


class SyntaxError_(AMQPError):  # trailing underscore: do not shadow the builtin
    reply_code = 502
    reply_name = "SYNTAX_ERROR"


class CommandInvalid(AMQPError):
    reply_code = 503
    reply_name = "COMMAND_INVALID"


class ChannelError(AMQPError):
    reply_code = 504
    reply_name = "CHANNEL_ERROR"


class UnexpectedFrame(AMQPError):
    reply_code = 505
    reply_name = "UNEXPECTED_FRAME"


class ResourceError(AMQPError):
    reply_code = 506
    reply_name = "RESOURCE_ERROR"


class NotAllowed(AMQPError):
    reply_code = 530
    reply_name = "NOT_ALLOWED"


class NotImplemented_(AMQPError):  # trailing underscore: do not shadow the builtin
    reply_code = 540
    reply_name = "NOT_IMPLEMENTED"


class InternalError(AMQPError):
    reply_code = 541
    reply_name = "INTERNAL_ERROR"


ERRORS_BY_CODE: dict[int, type[AMQPError]] = {
    cls.reply_code: cls
    for cls in (
        ContentTooLarge, NoConsumers, AccessRefused, NotFound, ResourceLocked,
        PreconditionFailed, ConnectionForced, InvalidPath, FrameError, SyntaxError_,
        CommandInvalid, ChannelError, UnexpectedFrame, ResourceError, NotAllowed,
        NotImplemented_, InternalError,
    )
}


def error_for_code(reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0) -> AMQPError:
    """Rebuild an error from its code (e.g. after it crossed a ring as a record); unknown → 541."""
    cls = ERRORS_BY_CODE.get(reply_code, InternalError)
    return cls(reply_text, class_id, method_id)
