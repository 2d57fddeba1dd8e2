"""User-facing errors: the CLI prints their message as one line and exits non-zero."""


class ServecastError(Exception):
    """A problem with the user's input (file, field, value); never a bug in the model."""


class SpecError(ServecastError):
    """A data file (hardware, architecture, workload, prices) failed validation."""

    def __init__(self, path: object, key: str, problem: str):
        super().__init__(f"{path}: {key}: {problem}")
        self.path, self.key, self.problem = path, key, problem


class Infeasible(ServecastError):
    """A configuration that cannot run (does not fit, invalid plan); carries the reason."""
