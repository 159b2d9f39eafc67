/* splitmix64: the one small deterministic generator the library uses (LoRA init, packing shuffles,
 * sampling). One state word, the same sequence on every platform, so seeded runs reproduce. Not for
 * anything that needs cryptographic or high-dimensional statistical quality. */
#ifndef LT_CORE_RNG_H
#define LT_CORE_RNG_H

#include <stdint.h>

static inline uint64_t lt_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#endif
