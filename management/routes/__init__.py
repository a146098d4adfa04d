"""The management API's handlers, a module per resource (RabbitMQ's ``rabbit_mgmt_wm_*``); each
has ``routes(ctx)``, which ``management.app`` puts together."""
