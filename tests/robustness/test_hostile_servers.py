"""Hostile HTTP shard servers: one that trickles its answer (a byte at a time, each within the
socket's timeout), one whose status text holds line breaks and terminal escapes, and one whose
shard index fails. The loader ends a slow answer at MIN_HTTP_RATE (here the bounds are lowered:
0.5 s of waiting, then 1 MiB/s), keeps every message one line, and says when an index it could not
read sends it to the shards' headers."""

from __future__ import annotations

import http.server
import threading
import time
import warnings

import pytest
from _images import color_folder

from fastdata import DataError
from fastdata._serve import _Handler
from fastdata.shard import write_shards
from fastdata.sources import shards, streams


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    folder = color_folder(tmp_path_factory.mktemp("imgs"), 2, 3, (20, 40), lambda j: f"{j:03d}.jpg")
    out = tmp_path_factory.mktemp("shards")
    write_shards(folder, out / "s-%06d.tar", max_count=6, shuffle=False, workers=1)
    return out


def _trickle(handler, data: bytes) -> None:
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    try:
        for i in range(len(data)):
            handler.wfile.write(data[i:i + 1])
            handler.wfile.flush()
            time.sleep(0.02)
    except OSError:  # the client gave up
        pass


def _wrong_range(handler, data: bytes, mode: str) -> None:
    """206 for a Range request, with the bytes a block later (shifted), the first 100 of those
    asked (short), each said in its Content-Range; or those asked, without one (unnamed)."""
    first, last = (int(x) for x in handler.headers["Range"].removeprefix("bytes=").split("-"))
    if mode == "shifted":
        first, last = first + 512, min(last + 512, len(data) - 1)
    elif mode == "short":
        last = first + 99
    handler.send_response(206)
    if mode != "unnamed":
        handler.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
    handler.send_header("Content-Length", str(last + 1 - first))
    handler.end_headers()
    handler.wfile.write(data[first:last + 1])


@pytest.fixture
def server(root, monkeypatch):
    """The shards of `root` (and their index) under /ok/; trickled a byte each 20 ms under
    /trickle/; HTTP 503 with a status text that rewrites the terminal's line under /busy/; the
    index alone failing (503) under /busyindex/, or trickled under /slowindex/; a range asked
    of a shard answered with others (`_wrong_range`) under /shifted/, /short/ and /unnamed/."""
    monkeypatch.setattr(streams, "HTTP_TIMEOUT", 0.5)
    monkeypatch.setattr(streams, "MIN_HTTP_RATE", 1 << 20)

    class Handler(_Handler):
        def do_GET(self):
            mode, _, name = self.path.lstrip("/").partition("/")
            self.path = "/" + name
            index = name.endswith("-index.json")
            if mode == "busy" or (mode == "busyindex" and index):
                self.send_response(503, "Busy\r\x1b[2K\x1b[1A\x1b[32mall shards verified OK\x1b[0m")
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif mode == "trickle" or (mode == "slowindex" and index):
                _trickle(self, (root / name).read_bytes())
            elif mode in ("shifted", "short", "unnamed") and "Range" in self.headers and not index:
                _wrong_range(self, (root / name).read_bytes(), mode)
            else:
                super().do_GET()

    Handler.root = str(root)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.timeout(60)
def test_a_server_trickling_its_answer_is_given_up_on(server):
    """A byte each 20 ms is 50 bytes a second: the shard of about 20 KB would take minutes (at a
    byte a second, hours), and no single wait reaches the socket's timeout."""
    assert len(shards(f"{server}/ok/s-000000.tar", progress=False)) == 6
    start = time.monotonic()
    with pytest.raises(DataError, match=r"cannot read shard http://.*/trickle/s-000000\.tar: TimeoutError: the "
                                        r"server sent \d+ bytes in \d+ s, slower than 1024 KiB/s"), \
            pytest.warns(UserWarning, match="could not be read"):  # its index too
        shards(f"{server}/trickle/s-000000.tar", progress=False)
    assert time.monotonic() - start < 10


@pytest.mark.timeout(60)
def test_a_server_status_text_stays_one_line(server):
    with pytest.raises(DataError) as e, pytest.warns(UserWarning, match="could not be read"):
        shards(f"{server}/busy/s-000000.tar", progress=False)
    assert str(e.value).endswith(r"HTTP 503 Busy\r\x1b[2K\x1b[1A\x1b[32mall shards verified OK\x1b[0m")
    assert str(e.value).isprintable()


@pytest.mark.timeout(60)
def test_an_index_that_cannot_be_read_is_said_so(server):
    """An index that fails (5xx) or trickles is not used, with a warning saying why: the shards
    are counted from their headers, every sample there. One that is not there (404) is not
    said: shards need no index."""
    for mode, why in (("busyindex", r"HTTP 503 Busy\\r"), ("slowindex", r"TimeoutError: the server sent")):
        with pytest.warns(UserWarning, match=rf"the index http://.*/{mode}/s-index\.json could not be read \({why}"):
            assert len(shards(f"{server}/{mode}/s-000000.tar", progress=False)) == 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(shards(f"{server}/ok/s-000000.tar", progress=False)) == 6


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode, answer", [("shifted", r"'bytes 512-\d+/\d+'"), ("short", r"'bytes 0-99/\d+'")])
def test_a_range_answered_with_other_bytes_is_said_so(server, mode, answer):
    """A server that answers a range request (206) with bytes from elsewhere or fewer than asked:
    each sample fails naming the server's answer, where the bytes were taken for those asked and
    the sample failed as a damaged tar header or a shard cut off there. A 206 that does not say
    which bytes it holds is taken as those asked for (here they are)."""
    import fastdata
    from fastdata import transforms as T

    kw = dict(batch_size=3, backend="wds", num_workers=0, transform=T.Compose([T.Resize(16), T.CenterCrop(16)]))
    loader = fastdata.loader(f"{server}/{mode}/s-{{000000..000000}}.tar", **kw)
    with pytest.raises(DataError, match=rf"/{mode}/s-000000\.tar.*cannot read the shard \(OSError: the server "
                                        rf"answered a request for bytes 0-\d+ with Content-Range {answer}\)"):
        next(iter(loader))
    for good in ("ok", "unnamed"):
        ok = fastdata.loader(f"{server}/{good}/s-{{000000..000000}}.tar", **kw)
        assert sorted(label for _, labels in ok for label in labels.tolist()) == [0, 0, 0, 1, 1, 1]
