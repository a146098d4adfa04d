"""AMQP reply codes: soft errors close the channel, hard errors close the connection (AMQP 0-9-1 §1.2)."""

from __future__ import annotations

import pytest

from broker import errors


@pytest.mark.parametrize(
    ("cls", "code", "hard"),
    [
        (errors.AccessRefused, 403, False),
        (errors.NotFound, 404, False),
        (errors.ResourceLocked, 405, False),
        (errors.PreconditionFailed, 406, False),
        (errors.FrameError, 501, True),
        (errors.SyntaxError_, 502, True),
        (errors.CommandInvalid, 503, True),
        (errors.ChannelError, 504, True),
        (errors.UnexpectedFrame, 505, True),
        (errors.ResourceError, 506, True),
        (errors.NotAllowed, 530, True),
        (errors.NotImplemented_, 540, True),
        (errors.InternalError, 541, True),
    ],
)
def test_error_carries_reply_code_and_severity(cls: type[errors.AMQPError], code: int, hard: bool) -> None:
    """Each error names its AMQP reply code; 4xx are channel errors, 5xx connection errors."""
    err = cls("why", 50, 10)
    assert isinstance(err, errors.AMQPError)
    assert (err.reply_code, err.hard, err.reply_text, err.class_id, err.method_id) == (code, hard, "why", 50, 10)
    assert errors.error_for_code(code, "why").__class__ is cls


def test_frame_text_is_rabbitmq_style() -> None:
    """RabbitMQ's reply-text is "<REPLY_NAME> - <explanation>"."""
    err = errors.NotFound("no queue 'q' in vhost '/'")
    assert err.frame_text == "NOT_FOUND - no queue 'q' in vhost '/'"
    assert str(err) == "no queue 'q' in vhost '/'"
    assert errors.error_for_code(999, "odd").reply_code == 541
