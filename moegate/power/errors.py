"""The power run's errors: each message is the one line a user needs, so the CLI prints it and exits 2."""


class PowerError(RuntimeError):
    """Bad input or a broken run; the message is the one line a user needs."""


class TargetNotFound(PowerError):
    """The vLLM sources lack a function, assignment or call the regions name."""


class ToolMissing(PowerError):
    """cosmic-ray is not importable by the harness's Python."""
