"""Reading a shard's bytes wherever its URL points: a local file, `file:`, HTTP(S) (with byte
ranges), or `pipe:` (a command whose stdout is the shard); and what a failed read says."""

from __future__ import annotations

URL_SCHEMES = ("pipe:", "http://", "https://", "file:")
"""The URL prefixes a shard source may have besides a plain path."""
HTTP_TIMEOUT = 60.0  # seconds


def local_path(url: str) -> str | None:
    """The file path a shard URL names, or None for a stream (pipe:, http(s):)."""
    if url.startswith("file:"):
        return url[len("file://"):] if url.startswith("file://") else url[len("file:"):]
    return None if url.startswith(("pipe:", "http://", "https://")) else url


def open_stream(url: str):
    """A binary stream of a whole shard: a file, an HTTP response, or webdataset's gopen for
    pipe: (a command whose stdout is the shard)."""
    local = local_path(url)
    if local is not None:
        return open(local, "rb")
    if url.startswith("pipe:"):
        import webdataset  # an optional dependency, needed for pipe: only

        return webdataset.gopen(url, "rb")
    return open_http(url)


def open_http(url: str, byte_range: tuple[int, int] | None = None):
    """The response to a GET of `url` (bytes [start, stop) of it with `byte_range`: a server
    may answer 200 with all of it instead of 206)."""
    # urllib rather than webdataset's gopen (curl): gopen retries an unreachable host for a
    # minute, and cannot ask for a byte range. Imported on first use: it brings http.client
    # and ssl, which `import fastdata` need not pay for.
    import urllib.request

    headers = {"Range": f"bytes={byte_range[0]}-{byte_range[1] - 1}"} if byte_range else {}
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=HTTP_TIMEOUT)


def read_range(url: str, start: int, view: memoryview) -> int:
    """Reads bytes [start, start + len(view)) of a shard into `view`; returns the count read
    (fewer where the shard ends sooner). Files seek, HTTP asks for the range (a server that
    ignores Range is read up to it); pipe: streams are read from the start (the wds backend
    keeps them open between reads instead)."""
    if not len(view):
        return 0
    local = local_path(url)
    if local is not None:
        with open(local, "rb", buffering=0) as f:
            f.seek(start)
            return fill(f, view)
    if url.startswith("pipe:"):
        with open_stream(url) as f:
            discard(f, start)
            return fill(f, view)
    with open_http(url, (start, start + len(view))) as r:
        if r.status != 206:
            discard(r, start)
        return fill(r, view)


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
    if isinstance(getattr(e, "code", None), int):  # urllib's HTTPError
        return f"HTTP {e.code} {getattr(e, 'reason', '')}".strip()
    reason = getattr(e, "reason", None)  # urllib's URLError
    if reason is not None:
        return f"{type(e).__name__}: {reason}"
    return getattr(e, "strerror", None) or f"{type(e).__name__}: {e}"
