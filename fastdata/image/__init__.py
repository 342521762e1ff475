"""Image mode's machinery, in the order a batch goes through it:

    order.py        which samples each batch holds: FileOrder, ShardOrder; Passes (the batch sampler)
    read.py         their bytes and labels: FileReader, the on_error policy (Failures)
    read_shards.py  ... from WebDataset shards: ShardReader (byte ranges, one block ahead)
    decode.py       check -> plan geometry -> decode into a slot -> CPU pixel ops: BatchDecoder
    cpu.py          who decodes on the CPU: DataLoader's workers running read + decode (CpuWorkers)
    dali.py         who decodes with DALI: the training process reads and checks, DALI decodes
    loader.py       ImageLoader: validation, the passes, stats, resume, the device stage hand-off

A backend (`fastdata.backends.pil`, `.wds`, `.dali`) is an order, a reader and who decodes.
The slot is `fastdata._buffers`; the transfer and the device stage are `fastdata.device`.
"""
