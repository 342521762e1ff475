"""fastdata's exceptions and warnings, and how a cause is put in a message."""

import os
import re
import sys
import warnings


class DataError(RuntimeError):
    """A sample could not be read or decoded. The message names the file (and tar member) and
    the cause; `path` and `member` carry them for code."""

    def __init__(self, message: str, path: str | None = None, member: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.member = member


# How a sample's DataError ends (`skippable`): the way past it. A command line shows its own
# flag instead (`fastdata._cli.run_command`'s skip_flag: "--on-error skip").
SKIP_OPTION = 'on_error="skip"'


def skippable(message: str) -> str:
    """A DataError's message for a sample that on_error="skip" would have left out: the message,
    ending with that way past it (one line)."""
    return f"{message}; to leave unreadable samples out and go on, pass {SKIP_OPTION}"


def shared_memory_error(e: BaseException, nbytes: int, folder: str = "/dev/shm") -> BaseException:
    """torch's error for shared memory it could not allocate because `folder` (where shm_open
    makes it) is full, as one line that says how full and what gives more: a Docker container
    gets 64 MiB there unless run with --shm-size or --ipc=host, a few batches of 224-pixel
    images. Any other error is returned as it is."""
    text = str(e)
    if not isinstance(e, RuntimeError) or "No space left on device" not in text:
        return e
    try:
        fs = os.statvfs(folder)
        free, size = fs.f_bavail * fs.f_frsize / 2**20, fs.f_blocks * fs.f_frsize / 2**20
        room = f"{folder} has {free:,.0f} MiB free of {size:,.0f}"
    except OSError:
        room = f"{folder} is full"
    return RuntimeError(one_line(
        f"cannot allocate {nbytes / 2**20:,.1f} MiB of shared memory for a batch: {room} (a Docker container gets 64 "
        "MiB unless run with --shm-size or --ipc=host); give it more (docker run --shm-size=8g, or --ipc=host), or "
        f"lower batch_size, num_workers or prefetch_factor (torch: {text.strip()})"))


# Characters that end or rewrite a line (str.splitlines' breaks, terminal escapes): a file or tar
# member name may hold any of them.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` with its control characters written as escapes (a line break in a file's name as
    \\n): a message naming input stays one line, and a name cannot forge a line of its own."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


# An object's default repr, as some libraries put it in their messages (Pillow: "cannot identify
# image file <_io.BytesIO object at 0x7f...>"): it says nothing to a user and differs each run.
_OBJECT_REPR = re.compile(r"\s*<[\w.]+ object at 0x[0-9a-fA-F]+>")


def error_line(e: BaseException) -> str:
    """An exception as one line of a message: its type and text, without object reprs or line
    breaks."""
    text = _OBJECT_REPR.sub("", str(e)).strip()
    if "Traceback (most recent call last)" in text:
        # torch re-raises a worker's error with the worker's traceback in its message: its last
        # line is the original "Type: message"
        return text.splitlines()[-1].strip()
    text = text.replace("\n", " ")
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message: str) -> None:
    """A UserWarning attributed to the line that called into fastdata, however deep the call
    that gives it (the source listing runs under `fastdata.loader`, `fastdata.sources.shards`,
    the shard writer, ...)."""
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, stacklevel=level)
