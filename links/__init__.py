"""Links between brokers: RabbitMQ's dynamic shovels (federation later), in a process of their own.

``links.process`` is the entry point the supervisor starts (broker.runtime.shovel_child);
``links.shovel`` is one shovel, an AMQP 0-9-1 client of both brokers (aiormq, asyncio). Nothing
in the broker's runtime imports this package.
"""
