// A read-only view of bytes held elsewhere (a Python object's buffer, held by the binding while
// the native code reads it): what the JPEG decoder and the tar walk take.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fastdata {

struct ByteSpan {
  const uint8_t* data;
  size_t size;
};

}  // namespace fastdata
