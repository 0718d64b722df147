// Randomness that is a pure function of its inputs, the same on every machine and
// standard library: the row initialisation every server, replay and restore must agree
// on, the embedding key space, and the generated CTR data. (std:: distributions are not
// portable across standard libraries; these are.)
#ifndef PARAMSERVER_COMMON_BASE_DETERMINISTIC_RANDOM_H_
#define PARAMSERVER_COMMON_BASE_DETERMINISTIC_RANDOM_H_

#include <cmath>
#include <cstdint>

namespace paramserver {

// SplitMix64's finaliser (Steele, Lea and Flood): a bijective 64-bit mix.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in the open interval (0, 1), from 53 of `bits`.
inline double UnitUniform(uint64_t bits) { return ((bits >> 11) + 0.5) * 0x1.0p-53; }

// A standard normal draw from two independent words (Box-Muller).
inline double StandardNormal(uint64_t bits_a, uint64_t bits_b) {
  return std::sqrt(-2 * std::log(UnitUniform(bits_a))) * std::cos(2 * M_PI * UnitUniform(bits_b));
}

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_BASE_DETERMINISTIC_RANDOM_H_
