"""The one error type users see: a one-line message naming the file and the problem, exit code 2."""


class LabError(Exception):
    """Bad input or a refused operation. The CLI prints `error: <message>` and exits with 2."""

    exit_code = 2

    def __init__(self, message: str, path=None):
        self.path = str(path) if path is not None else None
        super().__init__(f"{self.path}: {message}" if self.path else message)
