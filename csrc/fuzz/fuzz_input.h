// The fuzz targets' view of an input: a cursor that hands out bytes from the front, and zeros
// once the input runs out, so that every input, the empty one included, means one case.
// tests/robustness/test_fuzz.py reads the checked-in inputs with the same rules (its `Cursor`), so a case
// the fuzzer found replays through the Python API with the same parameters.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fastdata_fuzz {

struct Cursor {
  const uint8_t* data;
  size_t size, at = 0;
  uint8_t byte() { return at < size ? data[at++] : 0; }
};

}  // namespace fastdata_fuzz
