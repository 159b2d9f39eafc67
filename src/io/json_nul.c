/* The U+0000 scan of json_nul.h: one pass tracking whether the byte is inside a string, so an
 * escaped backslash followed by "u0000" (the six characters \u0000 as text) is not a NUL. */
#include "io/json_nul.h"

#include <string.h>

int64_t lt_json_nul_line(const char *s, size_t n) {
    int64_t line = 1;
    int in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '\0') return line;
        if (c == '\n') line++;
        if (!in_str) {
            in_str = c == '"';
            continue;
        }
        if (c == '"') {
            in_str = 0;
        } else if (c == '\\' && i + 1 < n) {
            if (s[i + 1] == 'u' && i + 5 < n && !memcmp(s + i + 2, "0000", 4)) return line;
            i++; /* the escaped character */
        }
    }
    return 0;
}
