"""The errors that end a command with a message (a user's unusable input: exit 2; a run stopped on purpose: exit
3), defined at the bottom of the import graph: ``verl.config`` re-exports ``ConfigError`` and the modules that raise
the others re-export theirs, so a utility below the config (``verl.utils.tracking``) can refuse a setting without
importing the config, and an entry point (``verl.trainer.cli``) catches them all without importing torch first."""


class ConfigError(ValueError):
    """A bad key or value in the config; the message names the key and what is allowed."""


class DataError(ValueError):
    """A data file that cannot be trained on; the message names the file, the row and the fix
    (``verl.utils.dataset``)."""


class RunDirError(ValueError):
    """The run directory holds a run this one must not continue or overwrite; the message says why and what to do
    (``verl.utils.run_dir``)."""


class CheckpointError(RuntimeError):
    """A checkpoint directory that cannot be resumed from; the message names it and the fix
    (``verl.utils.checkpoint``)."""


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (a health limit or an environment outage); the message says why and how to go on
    (``verl.trainer.health``)."""


class EnvironmentUnavailable(RuntimeError):
    """Raised by a recipe's generation when a service its environment needs (the retrieval service) stayed
    down past its own patience; the trainer then saves a checkpoint of the last finished step and stops
    (``verl.trainer.recipe``)."""
