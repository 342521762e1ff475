"""A shard sample's members, checked in the bytes a shard reader read (`read_shards.py`): each
tar header valid (`walk_tar_bytes`: USTAR, pax and GNU long names) and one of the sample's, as
many members and bytes as the index (or the header scan) said, the index's CRC-32, an image
member and an integer label within the classes; the members grouped by key as webdataset does.
What fails is recorded naming the shard and member, with its cause."""

from __future__ import annotations

import zlib

import numpy as np

from ..sources.tarformat import IMAGE_MEMBERS, Damage, split_name, walk_tar_bytes
from .read import MemberName


class Block:
    """A block's samples in stream order: ids, names (shard and image member), the image bytes
    and labels, or why a sample cannot be had; and `order`, the block's shuffle."""

    __slots__ = ("ids", "order", "names", "datas", "labels", "causes")

    def __init__(self, ids: np.ndarray, order: np.ndarray) -> None:
        self.ids = ids
        self.order = order
        self.names: list[str] = []
        self.datas: list[bytes | None] = []
        self.labels: list[int] = []
        self.causes: list[str | None] = []

    def add(self, name: str, data: bytes | None, label: int, cause: str | None) -> None:
        self.names.append(name)
        self.datas.append(data)
        self.labels.append(label)
        self.causes.append(cause)


def check_sample(out: Block, url: str, key: str, a: int, b: int, raw: memoryview, start: int,
                 expect: list[int], crc: int, stale: str, labels: tuple[int, str]) -> bool:
    """The sample `key` from its bytes [a, b) (in `raw`, which starts at shard byte `start`):
    every header there must be valid and name one of its members, they must be as many and
    as big as the index (or the scan) said, and the bytes must have the index's CRC-32 (crc,
    -1 for none to compare); else the sample fails naming the member. `labels`: (the bound the
    label is below, what it is, for the message). Whether its members passed these checks (the
    sample may still fail for its label or image member)."""
    found: dict[str, memoryview] = {}
    links: dict[str, str] = {}  # a link member's extension -> what it is (tarformat.Member.link)
    count = nbytes = 0
    length = start + len(raw)
    for m in walk_tar_bytes(raw, start, a, b, resync=False):
        if type(m) is Damage:
            where = m.name or (f"{key}.*" if key else f"at byte {m.offset}")
            out.add(MemberName(url, where), None, 0, m.cause)
            return False
        split = split_name(m.name)
        if split is None:  # webdataset's __metadata__ members
            continue
        k, ext = split
        if k != key:
            cause = (f"bytes [{a}, {b}) belong to no sample, but hold member {m.name}" if not key
                     else f"the member at byte {m.offset} is {m.name}, not one of sample {key}'s")
            out.add(MemberName(url, m.name), None, 0, stale + cause)
            return False
        if m.data + m.size > b:
            out.add(MemberName(url, m.name), None, 0,
                    f"{stale}member {m.name} at byte {m.offset} runs past its sample's end at byte {b}")
            return False
        if ext in found or ext in links:  # webdataset refuses it too; which of the two would be meant is not known
            out.add(MemberName(url, m.name), None, 0, f"sample {key} has two {ext} members (in any case)")
            return False
        count += 1
        if m.link is not None:  # no bytes to read (webdataset reads none either)
            links[ext] = m.link
            continue
        found[ext] = raw[m.data - start:m.data - start + m.size]
        nbytes += m.size
    if not key:
        out.add(MemberName(url, f"at byte {a}"), None, 0, f"bytes [{a}, {b}) belong to no sample")
        return False
    if not count:
        cause = f"the shard ends at byte {length}" if a >= length else "no member of it is there"
        out.add(MemberName(url, f"{key}.*"), None, 0, f"no such sample at byte {a}: {cause} (the shard is cut off, "
                                                    "or changed since it was indexed or counted)")
        return False
    if expect[0] >= 0 and (count, nbytes) != tuple(expect):
        out.add(MemberName(url, f"{key}.*"), None, 0, f"{stale}sample {key} at byte {a} has {count} member(s) of "
                                                    f"{nbytes} bytes, not {expect[0]} of {expect[1]}")
        return False
    if crc >= 0 and (got := zlib.crc32(raw[a - start:b - start])) != crc:
        out.add(MemberName(url, f"{key}.*"), None, 0, f"{stale}sample {key}'s bytes [{a}, {b}) have CRC-32 "
                                                    f"{got:08x}, not the index's {crc:08x}")
        return False
    _add(out, url, key, found, labels, links)
    return True

def _add(out: Block, url: str, key: str, sample: dict, labels: tuple[int, str], links: dict[str, str]) -> None:
    ext = next((e for e in IMAGE_MEMBERS if e in sample), None)
    # the image or the label it lacks, where a link stood for it
    lost = (next((e for e in IMAGE_MEMBERS if e in links), None) if ext is None else
            "cls" if "cls" not in sample else None)
    if lost in links:
        out.add(MemberName(url, f"{key}.{lost}"), None, 0, f"the member is {links[lost]}, and links are not read "
                                                          "(as webdataset reads none): store the file itself")
        return
    if ext is None:
        members = ", ".join(sorted([k for k in sample if not k.startswith("__")] +
                                   [f"{k} ({what})" for k, what in links.items()]))
        out.add(MemberName(url, f"{key}.*"), None, 0,
                f"the sample has no image member ({', '.join(IMAGE_MEMBERS)}), only: {members}")
        return
    name = MemberName(url, f"{key}.{ext}")
    cls = sample.get("cls")
    if cls is None:
        out.add(name, None, 0, "the sample has no cls member (its label)")
        return
    try:
        label = int(bytes(cls)) if len(cls) <= 20 else None
    except ValueError:
        label = None
    if label is None:
        out.add(MemberName(url, f"{key}.cls"), None, 0,
                f"the label should be an integer, but the cls member holds {bytes(cls[:40])!r}")
        return
    limit, what = labels
    if not 0 <= label < limit:
        out.add(MemberName(url, f"{key}.cls"), None, 0,
                f"the label should be in [0, {limit}) ({what}), but the cls member holds {label}")
        return
    out.add(name, sample[ext], label, None)
