"""Tars compressed as a stream (gzip, bzip2, xz), as webdataset reads them through tarfile's
"r|*": told by their first bytes, and read decompressed from their start. Imports nothing of
fastdata, so that the shard format (`tarformat`) and the reader (`streams`) can both use it."""

from __future__ import annotations

import bz2
import io
import lzma
import zlib

COMPRESSED_HEAD = 10  # the bytes `compression` looks at


def compression(head: bytes) -> str | None:
    """"gz", "bz2" or "xz" where a file's first COMPRESSED_HEAD bytes start such a stream, as
    tarfile tells them apart ("r|*"): more than the first bytes of a bzip2 stream, which a tar
    member named "BZh..." also starts with; else None."""
    if head.startswith(b"\x1f\x8b\x08"):
        return "gz"
    if head[:3] == b"BZh" and head[4:10] == b"1AY&SY":
        return "bz2"
    if head.startswith((b"\x5d\x00\x00\x80", b"\xfd7zXZ")):
        return "xz"
    return None


# liblzma's memory limit for an xz (or .lzma) tar: the format lets a 60 KB file ask for a
# dictionary of 1.5 GiB (4 GiB for .lzma), where `xz -9` needs 65 MiB to decompress.
MAX_XZ_MEMORY = 1 << 27

# The most a compressed tar may decompress to: MAX_RATIO bytes for each compressed byte read,
# past its first MAX_RATIO_FREE. gzip cannot give more (deflate's longest match, 258 bytes,
# takes at least 2 bits: 1,032 to 1); bzip2's run-length stage and xz reach millions to one,
# so that a 70 KB file would decompress to the 64 GiB a stream may hold, each time it is read.
MAX_RATIO = 1032
MAX_RATIO_FREE = 1 << 24


def decompressing(f, kind: str):
    """A binary reader of what `f`, a stream of `compression` `kind`, decompresses
    to; closing it does not close `f`. Its errors: EOFError (cut off), zlib.error, OSError
    (bzip2's, or over MAX_RATIO), lzma.LZMAError (corrupt, or over MAX_XZ_MEMORY)."""
    return io.BufferedReader(_Streams(f, kind), _Streams.READ)


class _Streams(io.RawIOBase):
    """Compressed streams (gzip members, bzip2 or xz streams), one after another, each output
    asked for decompressed from 1 MiB reads of `f` in one call. Written here rather than
    taken from gzip.GzipFile, bz2.BZ2File and lzma.LZMAFile: they decompress 8 KiB of input a
    call (Python-level work a fifth of the inflate's own on a shard of JPEGs), and LZMAFile
    takes no memory limit. As they do, bytes after a whole stream that start no other are the
    end, and a gzip member's CRC-32 and length are checked (zlib's gzip mode)."""

    READ = 1 << 20

    def __init__(self, f, kind: str) -> None:
        super().__init__()
        self._f, self._kind = f, kind
        self._d, self._pending = self._new(), b""
        self._tentative = False  # a stream after the first that gave nothing yet: maybe padding or other bytes
        self._in = self._out = 0  # compressed bytes read, bytes decompressed

    def _new(self):
        if self._kind == "gz":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)  # (a gzip header and trailer)
        return bz2.BZ2Decompressor() if self._kind == "bz2" else lzma.LZMADecompressor(memlimit=MAX_XZ_MEMORY)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while True:
            try:
                if self._d.eof:
                    # (all the input past the stream's end: zlib may leave it in unconsumed_tail as well)
                    self._pending = self._d.unused_data or self._read()
                    if not self._pending:
                        return 0
                    self._d, self._tentative = self._new(), True
                # zlib hands back the input it did not take (unconsumed_tail); bz2 and lzma keep it
                hungry = not self._pending if self._kind == "gz" else self._d.needs_input and not self._pending
                if hungry:
                    self._pending = self._read()
                    if not self._pending:
                        if self._tentative:
                            return 0
                        raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                # (no more than the bound lets it give: what came before the bound is had)
                room = MAX_RATIO_FREE + MAX_RATIO * self._in - self._out
                data = self._d.decompress(self._pending, max(1, min(len(b), room)))
                self._pending = self._d.unconsumed_tail if self._kind == "gz" else b""
            except (zlib.error, OSError, lzma.LZMAError) as e:
                if self._tentative:  # bytes after a stream that start no other: the end
                    return 0
                if isinstance(e, lzma.LZMAError) and "limit" in str(e):
                    raise lzma.LZMAError(f"it needs more than the {MAX_XZ_MEMORY >> 20} MiB of memory an xz tar "
                                         f"may take to decompress ({e})") from None
                raise
            if data:
                self._tentative, self._out = False, self._out + len(data)
                if len(data) > room:
                    raise OSError(f"it decompresses to over {MAX_RATIO:,} times its size ({self._out:,} bytes from "
                                  f"{self._in:,}), more than gzip can: a decompression bomb")
                b[:len(data)] = data
                return len(data)

    def _read(self) -> bytes:
        data = self._f.read(self.READ)
        self._in += len(data)
        return data


def decompressed(f):
    """`f` (a binary stream of a whole shard), or a `Decompressed` one where its first bytes
    start a compressed stream; one that cannot seek is read on through `_Prefixed`, its first
    bytes handed out again. Closes `f` where this fails."""
    try:
        if getattr(f, "seekable", lambda: False)():
            kind = compression(f.read(COMPRESSED_HEAD))
            f.seek(0)
        else:
            f = _Prefixed(f)
            kind = compression(f.head)
        return Decompressed(f, kind) if kind else f
    except BaseException:
        f.close()
        raise


class _Prefixed:
    """A stream that cannot seek, its first bytes read (`head`) and handed out again first."""

    def __init__(self, f) -> None:
        self.f, self.head = f, b""
        while len(self.head) < COMPRESSED_HEAD and (chunk := f.read(COMPRESSED_HEAD - len(self.head))):
            self.head += chunk
        self._left = self.head

    def read(self, n: int = -1) -> bytes:
        if not self._left:
            return self.f.read(n)
        if n is None or n < 0:
            data, self._left = self._left + self.f.read(), b""
            return data
        data, self._left = self._left[:n], self._left[n:]
        return data

    def close(self) -> None:
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Decompressed(io.RawIOBase):
    """What a compressed tar (gzip, bzip2, xz: `_Streams`) decompresses to, read
    on from its start as a stream is: a shard that cannot be read by byte range. A stream that
    is corrupt or cut off ends where it fails, as a plain tar cut off there ends, and `error`
    says why (a tar's members past it cannot be found: a stream does not resync); a failed read
    of the compressed bytes themselves (a server, a pipe) raises as it is. Closing it closes the
    compressed stream too."""

    def __init__(self, f, kind: str) -> None:
        super().__init__()
        self.raw, self.kind, self.error, self.at = f, kind, None, 0
        self._source = _Source(f)
        self._inner = _Streams(self._source, kind)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.error is not None:
            return 0
        try:
            n = self._inner.readinto(b)  # (one decompress call: what it gave is had before a next one fails)
        except Exception as e:  # the decompressor's own (EOFError, zlib.error, lzma.LZMAError, OSError)
            if self._source.failed:
                raise
            self.error = (f"the {self.kind} stream fails at byte {self.at} of what it decompresses to "
                          f"({type(e).__name__}: {e})")
            return 0
        self.at += n
        return n

    def close(self) -> None:
        if not self.closed:
            try:
                self._inner.close()
            finally:
                self.raw.close()
        super().close()


class _Source:
    """The compressed bytes a decompressor reads, with whether a read of them failed."""

    def __init__(self, f) -> None:
        self.f, self.failed = f, False

    def read(self, n: int = -1) -> bytes:
        try:
            return self.f.read(n)
        except BaseException:
            self.failed = True
            raise
