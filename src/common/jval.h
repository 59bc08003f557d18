/* jval — the typed, range-checked read of one JSON value, written once for the two
 * front ends that word its verdicts: the configuration getters (cfg.h, cfgtab.h: every
 * error collected, messages show the offending value) and the wire parsers
 * (wire_internal.h: the first error, messages name the JSON type, the caller answers with
 * upstream's status code).
 *
 * Each function classifies v and, on JVAL_OK, stores the value. The rules (strict types:
 * booleans are not numbers and numbers are not booleans; an integer accepts a JSON real
 * only when it has no fraction; strings with an embedded NUL are refused because C APIs
 * would silently shorten them; port strings are decimal digits only) are here and nowhere
 * else. Pure functions, thread-safe. */
#ifndef MOTOR_JVAL_H
#define MOTOR_JVAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum jval_rc {
    JVAL_OK = 0,
    JVAL_TYPE,     /* wrong JSON type (an integer: also a real with a fraction or too large) */
    JVAL_RANGE,    /* right type, outside [min, max] (*out holds the value read) */
    JVAL_NUL,      /* a string with an embedded NUL */
    JVAL_LONG,     /* a string above max_len bytes, an array above max_n elements */
    JVAL_NEGATIVE, /* a numeric string given as a negative integer */
    JVAL_NOT_PORT, /* a port string that is not 1..65535 in decimal digits */
    JVAL_NOMATCH,  /* a string that is none of the allowed names */
};

/* Reals accepted as integers only within +-2^53, where every integer is exact (the wire's
 * rule: a peer's 1e17 is a float, not an id). Without it, any integral real that fits in
 * int64 is accepted (the configuration's rule). */
#define JVAL_INT_EXACT 1u

/* An integer (or an integral real) in [min, max]. */
enum jval_rc jval_int(const json_t *v, int64_t min, int64_t max, unsigned flags, int64_t *out);
/* A finite number in [min, max] (*out holds it on JVAL_RANGE, also when not finite). */
enum jval_rc jval_double(const json_t *v, double min, double max, double *out);
enum jval_rc jval_bool(const json_t *v, bool *out);
/* A string of at most max_len bytes without NUL; *out borrowed from v, *len its length
 * (len may be NULL). */
enum jval_rc jval_string(const json_t *v, size_t max_len, const char **out, size_t *len);
/* One of names (NULL-terminated, case-sensitive): *index. JVAL_TYPE/JVAL_NUL as a string. */
enum jval_rc jval_enum(const json_t *v, const char *const *names, int *index);
/* A string, or a non-negative integer written as its decimal digits: *out a heap copy
 * (only on JVAL_OK). */
enum jval_rc jval_numstr(const json_t *v, size_t max_len, char **out);
/* jval_numstr whose value is a port 1..65535 in digits only ("+80" and " 80" are refused:
 * they would not compare equal to a derived port). On JVAL_NOT_PORT *out is the string
 * read (heap, the caller frees it; it names it in the message). */
enum jval_rc jval_portstr(const json_t *v, size_t max_len, char **out);
/* An array of at most max_n elements. */
enum jval_rc jval_array(const json_t *v, size_t max_n);

/* The value of a decimal port string 1..65535; 0 when s is not one. */
int jval_port_value(const char *s);
/* "a string", "an integer", "a real number", "a boolean", "null", "an object", "an
 * array" ("nothing" for NULL), for messages that name the type. */
const char *jval_type_name(const json_t *v);

#endif
