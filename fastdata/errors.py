"""fastdata's exceptions."""


class DataError(RuntimeError):
    """A sample could not be read or decoded. The message names the file (and tar member) and
    the cause; `path` and `member` carry them for code."""

    def __init__(self, message: str, path: str | None = None, member: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.member = member
