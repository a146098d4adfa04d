"""The management process: RabbitMQ's management HTTP API (3.x shapes), off the message path.

``management.process`` is the process the supervisor starts (``shoal serve --management-port``);
``management.stats`` polls the supervisor's control socket and keeps the samples;
``management.shapes`` turns them into RabbitMQ's objects; ``management.listing`` pages, sorts,
filters and picks columns as RabbitMQ does; ``management.app`` routes (Starlette);
``management.amqp_ops`` does the writes that are AMQP operations over an AMQP connection to the
broker's own port, as the HTTP user; ``management.auth`` checks HTTP basic credentials.
"""
