# test_dataloader.py here runs through tests/contract/test_torch_dataloader.py, which serves its
# DataLoaders by fastdata; collected on its own it would only test torch's DataLoader.
collect_ignore = ["test_dataloader.py"]
