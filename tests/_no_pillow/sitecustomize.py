"""A Python without Pillow, for tests that run a process with this folder on PYTHONPATH (site
imports `sitecustomize` at start-up): `import PIL` (and any `PIL.` module) fails as where it is
not installed, with the same ModuleNotFoundError, in that process and in the processes it starts.
Nothing else changes."""

import sys


class _NoPillow:
    def find_spec(self, name, path=None, target=None):
        if name == "PIL" or name.startswith("PIL."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoPillow())
