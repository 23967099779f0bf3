"""The one error type users see: a one-line message naming the file and the problem, exit code 2."""


class LabError(Exception):
    """Bad input or a refused operation. The CLI prints `error: <message>` and exits with 2."""

    exit_code = 2

    def __init__(self, message: str, path=None):
        self.path = str(path) if path is not None else None
        super().__init__(f"{self.path}: {message}" if self.path else message)


def run_module(main) -> None:
    """`python -m` entry of a module with its own `main(argv=None)` (the benchmarks): a LabError
    ends it as the CLI would, one line on stderr and exit code 2."""
    import sys

    try:
        sys.exit(main())
    except LabError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
