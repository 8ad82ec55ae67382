"""The error every layer may raise for a bad setting, defined at the bottom of the import graph (``verl.config``
re-exports it), so a utility below the config (``verl.utils.tracking``) can refuse a setting without importing
the config."""


class ConfigError(ValueError):
    """A bad key or value in the config; the message names the key and what is allowed."""
