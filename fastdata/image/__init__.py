"""Image mode's machinery, in the order a batch goes through it:

    parts.py        the protocols of a backend's three parts: BatchOrder, Reader, Runner
    order.py        which samples each batch holds: FileOrder, ShardOrder; Passes (the batch sampler)
    read.py         their bytes and labels: FileReader, the on_error policy (Failures)
    read_shards.py  ... from WebDataset shards: ShardReader (byte ranges, one block ahead)
    shard_samples.py  a shard sample's members checked in the bytes read: headers, sizes, CRC-32, label
    check.py        whether each file is a whole image within the pixel limit (fastdata shard's check too)
    record.py       what a loader's processes share of its samples: files checked whole, checksums compared
    decode.py       check -> plan geometry -> decode into a slot -> CPU pixel ops: BatchDecoder
    cpu.py          runner: DataLoader's workers running read + decode (CpuWorkers)
    threads.py      runner: a decode thread in the training process (InProcess)
    dali.py         runner: the training process reads and checks, DALI decodes (DaliDecoders)
    ray.py          runner: Ray actors on a cluster (RayWorkers); ray_actors.py, the actors and their pool
    options.py      ImageOptions: the keywords, built once by fastdata.loader
    loader.py       ImageLoader: validation, the passes, stats, resume, the device stage hand-off

A backend (`fastdata.backends.pil`, `.wds`, `.dali`, `.ray`) is an order, a reader and a
runner; the backends sit above this package, which imports none of them. The slot is
`fastdata._buffers`; the transfer and the device stage are `fastdata.device`.
"""
