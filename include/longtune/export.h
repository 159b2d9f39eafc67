/* LT_API marks the library's public functions. The library is compiled with hidden visibility
 * (-fvisibility=hidden), so a shared build exports exactly the functions declared with LT_API in
 * include/longtune/; everything else stays internal to the library. A static link resolves every
 * symbol either way. */
#ifndef LONGTUNE_EXPORT_H
#define LONGTUNE_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define LT_API __attribute__((visibility("default")))
#else
#define LT_API
#endif

#endif
