"""Reading a shard's bytes wherever its URL points: a local file, `file:`, HTTP(S) (with byte
ranges), or `pipe:` (a command whose stdout is the shard); and what a failed read says."""

from __future__ import annotations

import errno
import functools
import os
import re
import stat
import time

from ..errors import one_line
from .compressed import decompressed

URL_SCHEMES = ("pipe:", "http://", "https://", "file:")
"""The URL prefixes a shard source may have besides a plain path."""
HTTP_TIMEOUT = 60.0  # seconds
MIN_HTTP_RATE = 64 << 10
"""The slowest answer read, in bytes a second: a server has HTTP_TIMEOUT seconds of waiting, and
one more for each MIN_HTTP_RATE bytes it has sent (its headers included), to send them. The
socket's timeout bounds one wait only, so a server sending a byte every few seconds would hold a
read (or the listing of its shards) for hours."""


def local_path(url: str) -> str | None:
    """The file path a shard URL names, or None for a stream (pipe:, http(s):)."""
    if url.startswith("file:"):
        return url[len("file://"):] if url.startswith("file://") else url[len("file:"):]
    return None if url.startswith(("pipe:", "http://", "https://")) else url


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _not_regular(mode: int) -> str:
    """Why a file of this st_mode is not read (the extension's words, csrc/read.cpp)."""
    kind = next((name for test, name in _KINDS if test(mode)), None)
    return f"not a regular file ({kind})" if kind else "not a regular file"


def open_regular(path) -> tuple[int, os.stat_result] | str:
    """(an open descriptor, its fstat) of a regular file, or why not:
    OSError's strerror, "embedded null byte", or "not a regular file (a FIFO)" and the like,
    the file closed unread. What the extension's open_files does for each path."""
    try:
        # O_NONBLOCK: a FIFO's open returns at once instead of waiting for a writer; it changes
        # nothing for a regular file's reads. O_NOCTTY: a terminal never becomes this process's.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        try:  # a socket cannot be opened (ENXIO): named by its kind, as any file not read
            mode = os.stat(path).st_mode
        except OSError:
            mode = None
        if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            return _not_regular(mode)
        return e.strerror or type(e).__name__
    except ValueError as e:  # a NUL inside the path
        return str(e)
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        return e.strerror or type(e).__name__
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return os.strerror(errno.EISDIR) if stat.S_ISDIR(st.st_mode) else _not_regular(st.st_mode)
    return fd, st


def open_file(path: str):
    """A regular file opened for reading (binary, unbuffered), else OSError saying why not: a
    shard that is a FIFO would block its open or read until a writer came, /dev/zero give bytes
    without end."""
    opened = open_regular(path)
    if isinstance(opened, str):
        raise OSError(errno.EINVAL, opened)
    return os.fdopen(opened[0], "rb", buffering=0)


def identity(st: os.stat_result) -> tuple[int, ...]:
    """What tells a file's contents from those it had before it was written again: (device,
    inode, size, mtime, ctime). A write moves the ctime, which cannot be set back."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def open_stream(url: str):
    """A binary stream of a whole shard: a file, an HTTP response, or webdataset's gopen for
    pipe: (a command whose stdout is the shard); a `compressed.Decompressed` one where its
    bytes are a compressed tar."""
    local = local_path(url)
    if local is not None:
        f = open_file(local)
    elif url.startswith("pipe:"):
        import webdataset  # an optional dependency, needed for pipe: only

        f = webdataset.gopen(url, "rb")
    else:
        f = open_http(url)
    return decompressed(f)


def drop(stream) -> None:
    """Closes a stream left part-read (`open_stream`'s): a pipe:'s command is killed first, as
    it would wait for its reader, and what closing it raises is not this read's failure (a
    command stopped part-way exits non-zero: SIGPIPE, curl's 23)."""
    inner = stream
    for _ in range(3):  # through Decompressed and _Prefixed to webdataset's Pipe
        proc = getattr(inner, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            break
        inner = getattr(inner, "raw", None) or getattr(inner, "f", None)
    try:
        stream.close()
    except Exception:
        pass


def open_http(url: str, byte_range: tuple[int, int] | None = None):
    """The response to a GET of `url` (bytes [start, stop) of it with `byte_range`: a server
    may answer 200 with all of it instead of 206)."""
    # urllib rather than webdataset's gopen (curl): gopen retries an unreachable host for a
    # minute, and cannot ask for a byte range. Imported on first use: it brings http.client
    # and ssl, which `import fastdata` need not pay for.
    import urllib.request

    headers = {"Range": f"bytes={byte_range[0]}-{byte_range[1] - 1}"} if byte_range else {}
    request = urllib.request.Request(url, headers=headers)
    if urllib.request._opener is not None:  # the script's install_opener (its auth, its TLS): as urlopen uses it
        return urllib.request.urlopen(request, timeout=HTTP_TIMEOUT)
    return _opener().open(request, timeout=HTTP_TIMEOUT)


class _Paced:
    """A socket whose reads hold a server to MIN_HTTP_RATE: http.client reads a response's
    headers and body through recv_into."""

    _got = 0  # bytes received
    _waited = 0.0  # seconds spent waiting for them

    def recv_into(self, buffer, *args, **kwargs):
        left = HTTP_TIMEOUT + self._got / MIN_HTTP_RATE - self._waited
        if left <= 0:
            raise self._slow()
        self.settimeout(min(HTTP_TIMEOUT, left))
        start = time.monotonic()
        try:
            got = super().recv_into(buffer, *args, **kwargs)
        except TimeoutError:
            self._waited += time.monotonic() - start
            if left < HTTP_TIMEOUT:  # the pace's limit, not a silence of HTTP_TIMEOUT
                raise self._slow() from None
            raise
        self._waited += time.monotonic() - start
        self._got += got
        return got

    def _slow(self) -> TimeoutError:
        return TimeoutError(f"the server sent {self._got} bytes in {self._waited:.0f} s, slower than "
                            f"{MIN_HTTP_RATE >> 10} KiB/s")


@functools.cache
def _opener():
    """urllib's opener, its connections' sockets _Paced (HTTPS: through the SSL context's socket
    class, a context for each connection as http.client makes it: ssl's default, or what the
    script put in its place); redirects, proxies and errors as urlopen's."""
    import http.client
    import socket
    import ssl
    import urllib.request

    class PacedSocket(_Paced, socket.socket):
        pass

    class PacedSSLSocket(_Paced, ssl.SSLSocket):
        pass

    class Connection(http.client.HTTPConnection):
        def connect(self) -> None:
            super().connect()
            sock = self.sock
            self.sock = PacedSocket(sock.family, sock.type, sock.proto, sock.detach())
            self.sock.settimeout(HTTP_TIMEOUT)

    class Handler(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(Connection, req)

    class SecureHandler(urllib.request.HTTPSHandler):
        def https_open(self, req):
            # PEP 476's hook (SSL_CERT_FILE read now, an unverified context the script chose)
            context = ssl._create_default_https_context()
            context.set_alpn_protocols(["http/1.1"])
            if context.post_handshake_auth is not None:
                context.post_handshake_auth = True
            context.sslsocket_class = PacedSSLSocket
            return self.do_open(http.client.HTTPSConnection, req, context=context)

    return urllib.request.build_opener(Handler, SecureHandler)


def http_size(url: str) -> int | None:
    """The size of the object at HTTP(S) `url`, from the answer to a GET of its first byte
    (Content-Range's total, or Content-Length where the server ignores Range); None where the
    answer gives neither. The body is not read."""
    with open_http(url, (0, 1)) as r:
        m = _CONTENT_RANGE.fullmatch((r.headers.get("Content-Range") or "").strip())
        if r.status == 206 and m and m.group(3) != "*":
            return int(m.group(3))
        length = (r.headers.get("Content-Length") or "").strip()
        plain = length.isascii() and length.isdigit() and len(length) <= 20
        return int(length) if r.status == 200 and plain else None


def read_range(url: str, start: int, view: memoryview) -> int:
    """Reads bytes [start, start + len(view)) of a shard into `view`; returns the count read
    (fewer where the shard ends sooner). Files seek, HTTP asks for the range (a server that
    ignores Range is read up to it; one that answers with another range is an OSError:
    `_check_range`); pipe: streams are read from the start (the wds backend
    keeps them open between reads instead)."""
    if not len(view):
        return 0
    local = local_path(url)
    if local is not None:
        return read_file_range(local, start, view)[0]
    if url.startswith("pipe:"):
        with open_stream(url) as f:
            discard(f, start)
            return fill(f, view)
    with open_http(url, (start, start + len(view))) as r:
        if r.status == 206:
            _check_range(r.headers.get("Content-Range"), start, start + len(view))
        else:
            discard(r, start)
        return fill(r, view)


# Content-Range's `bytes first-last/size` (RFC 9110), ASCII digits, at most 20 of them each
_CONTENT_RANGE = re.compile(r"bytes (\d{1,20})-(\d{1,20})/(\d{1,20}|\*)", re.ASCII | re.IGNORECASE)


def _check_range(given: str | None, start: int, stop: int) -> None:
    """A 206 answer's Content-Range (`bytes a-b/size`) starts at the byte asked for and goes on
    to `stop` or to the object's end: else OSError saying what came. Bytes from elsewhere in
    the shard would fail as a sample its index does not describe (as if the index were stale),
    and a range cut short as a shard that ends there. A 206 without one (which HTTP does not
    allow for one range) is taken as the bytes asked for: the index's checksums still hold them
    to it."""
    if given is None:
        return
    m = _CONTENT_RANGE.fullmatch(given.strip())
    first, last, size = (int(x) if x and x != "*" else None for x in m.groups()) if m else (None, None, None)
    if first != start or last is None or last < first or (last < stop - 1 and size != last + 1):
        raise OSError(f"the server answered a request for bytes {start}-{stop - 1} with Content-Range "
                      f"{given!r:.80}")


def read_file_range(path: str, start: int, view: memoryview) -> tuple[int, tuple[int, ...]]:
    """(the count read into `view` from byte `start` of the file, the `identity` of the file
    read, by fstat of its descriptor after the read: a write before the read's end shows)."""
    with open_file(path) as f:
        f.seek(start)
        got = fill(f, view)
        return got, identity(os.fstat(f.fileno()))


def fill(f, view: memoryview) -> int:
    """Reads into `view` until it is full or `f` ends; the count read."""
    got = 0
    readinto = getattr(f, "readinto", None)  # webdataset's Pipe has read() only
    while got < len(view):
        if readinto is not None:
            k = readinto(view[got:])
        else:
            chunk = f.read(min(len(view) - got, 1 << 20))
            k = len(chunk)
            view[got:got + k] = chunk
        if not k:
            break
        got += k
    return got


def discard(f, n: int) -> int:
    """Reads `n` bytes of `f` and drops them (fewer where it ends sooner); the count dropped."""
    left = n
    while left > 0:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            break
        left -= len(chunk)
    return n - left


def describe_error(e: BaseException) -> str:
    """What a failed read says, in a few words: "HTTP 404 Not Found", "URLError: <reason>",
    an OSError's strerror, else "<type>: <message>"."""
    # (one line: a server's status text and a redirect loop's message are the server's words)
    if isinstance(getattr(e, "code", None), int):  # urllib's HTTPError
        return one_line(f"HTTP {e.code} {getattr(e, 'reason', '')}".strip())
    reason = getattr(e, "reason", None)  # urllib's URLError
    if reason is not None:
        return one_line(f"{type(e).__name__}: {reason}")
    return one_line(getattr(e, "strerror", None) or f"{type(e).__name__}: {e}")
