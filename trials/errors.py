"""The one exception every layer raises for bad input (the bottom of the import graph)."""


class ConfigError(ValueError):
    """A trial config that cannot be run; the message is one line meant for the user."""
