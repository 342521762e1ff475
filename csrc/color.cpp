// Compiled with -ffp-contract=off (CMakeLists.txt): a fused multiply-add would round once where
// Pillow's code rounds twice. Pillow's calls are replaced only where the result is the same for
// every input they get here: fmod(x, 1.0) of x in [0, 2) is x or x - 1 (exact), floor and round
// of a non-negative double are its integer part, plus one where round's remainder is >= 0.5.
// Branches on the pixel (which channel is the largest, which sixth of the hue circle) are
// selects, and what depends on one byte alone comes from a table: natural images make those
// branches unpredictable.
#include "color.h"

namespace fastdata {
namespace {

// What HSV -> RGB derives from one byte: for a hue h, the sixth i and the remainder f; for a
// saturation s, fs; and for RGB -> HSV, each quotient float(d) / float(c) of 0 <= d <= c <= 255
// (c = 0 as 1) and the saturation byte of each (max, max - min); each with Pillow's expressions.
// Made on first use (a static local: once, whichever thread comes first), 320 KiB.
struct Tables {
  int sixth[256];
  float rest[256];
  float sat[256];
  float quotient[256][256];
  uint8_t saturation[256][256];
  Tables() {
    for (int c = 0; c < 256; ++c) {
      for (int d = 0; d < 256; ++d) {
        quotient[c][d] = float(d) / float(c ? c : 1);
        // (max, max - min): s = (max - min) / max, as Pillow's float, then its byte
        saturation[c][d] = d <= c && c ? uint8_t(int(double(float(d) / float(c)) * 255.0)) : 0;
      }
    }
    for (int h = 0; h < 256; ++h) {
      const double h6 = double(float(h)) * 6.0 / 255.0;
      sixth[h] = int(h6) % 6;  // 6 for h = 255 (f = 0 there): Pillow's switch takes i % 6
      rest[h] = float(h6 - double(float(int(h6))));
      sat[h] = float(double(float(h)) / 255.0);
    }
  }
};
const Tables& tables() {
  static const Tables made;
  return made;
}

inline int rounded(double x) {  // C's round of x in [0, 255]
  const int whole = int(x);
  return whole + (x - double(whole) >= 0.5);
}

inline void hsv_of(const Tables& tab, const uint8_t* in, uint8_t* out) {
  const int r = in[0], g = in[1], b = in[2];
  const int maxc = r > g ? (r > b ? r : b) : (g > b ? g : b);
  const int minc = r < g ? (r < b ? r : b) : (g < b ? g : b);
  const bool grey = minc == maxc;
  const float* over = tab.quotient[maxc - minc];  // (grey: over 1, and the hue is 0 anyway)
  const float rc = over[maxc - r], gc = over[maxc - g], bc = over[maxc - b];
  const float hr = bc - gc;
  const float hg = float(2.0 + double(rc) - double(bc));
  const float hb = float(4.0 + double(gc) - double(rc));
  const float h = r == maxc ? hr : (g == maxc ? hg : hb);
  const double x = double(h) / 6.0 + 1.0;  // in [5/6, 11/6)
  const float hue = float(x >= 1.0 ? x - 1.0 : x);
  // both in [0, 255): Pillow's CLIP8 changes nothing
  out[0] = uint8_t(grey ? 0 : int(double(hue) * 255.0));
  out[1] = tab.saturation[maxc][maxc - minc];
  out[2] = uint8_t(maxc);
}

inline void rgb_of(const Tables& tab, const uint8_t* in, uint8_t* out) {
  // s = 0 needs no case of its own: fs = 0 makes p, q and t all v, as Pillow's grey is
  const int h = in[0], s = in[1], v = in[2];
  const float f = tab.rest[h], fs = tab.sat[s];
  const double vf = double(v);
  const int p = rounded(vf * (1.0 - double(fs)));
  const int q = rounded(vf * (1.0 - double(fs * f)));
  const int t = rounded(vf * (1.0 - double(fs) * (1.0 - double(f))));
  // Pillow's six cases: (v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)
  const int i = tab.sixth[h];
  const int values[4] = {v, p, q, t};
  static constexpr uint8_t pick[6][3] = {{0, 3, 1}, {2, 0, 1}, {1, 0, 3}, {1, 2, 0}, {3, 1, 0}, {0, 1, 2}};
  out[0] = uint8_t(values[pick[i][0]]);
  out[1] = uint8_t(values[pick[i][1]]);
  out[2] = uint8_t(values[pick[i][2]]);
}

}  // namespace

void hue_shift(const uint8_t* src, uint8_t* dst, int64_t n, int shift) {
  const Tables& tab = tables();
  for (int64_t k = 0; k < n; ++k, src += 3, dst += 3) {
    uint8_t hsv[3];
    hsv_of(tab, src, hsv);
    hsv[0] = uint8_t(hsv[0] + shift);
    rgb_of(tab, hsv, dst);
  }
}

void rgb_to_hsv(const uint8_t* src, uint8_t* dst, int64_t n) {
  const Tables& tab = tables();
  for (int64_t k = 0; k < n; ++k) hsv_of(tab, src + 3 * k, dst + 3 * k);
}

void hsv_to_rgb(const uint8_t* src, uint8_t* dst, int64_t n) {
  const Tables& tab = tables();
  for (int64_t k = 0; k < n; ++k) rgb_of(tab, src + 3 * k, dst + 3 * k);
}

}  // namespace fastdata
