/* U+0000 in JSON text: cJSON keeps strings as C strings, so a string holding U+0000 (a \u0000
 * escape, or a raw NUL byte) would silently lose everything after it. Every JSON reader refuses
 * such text first. Internal to the library. */
#ifndef LT_IO_JSON_NUL_H
#define LT_IO_JSON_NUL_H

#include <stddef.h>
#include <stdint.h>

/* The 1-based line of the first U+0000 in the n bytes at s (a raw NUL byte anywhere, or a
 * \u0000 escape inside a string), or 0 when there is none. */
int64_t lt_json_nul_line(const char *s, size_t n);

#endif
