// FASTDATA_AVX2_CLONE: a loop function compiled twice, for AVX2 and for the baseline, the one the
// CPU runs picked when the module loads (on x86-64 with glibc; elsewhere the baseline alone).
// (target_clones needs the compiler's support, GCC 6 and Clang 14 on, and glibc's ifunc)
#pragma once

#if defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define FASTDATA_AVX2_CLONE __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef FASTDATA_AVX2_CLONE
#define FASTDATA_AVX2_CLONE
#endif
