/* wire_internal — field getters shared by the wire_* parsers (not a public contract).
 *
 * The checks are common/jval.h's (shared with the configuration getters); these word
 * them the wire's way: the first error only, the JSON type named ("got a string"). Each
 * getter reads obj[key], checks it and reports "<path>.<key>: <problem>" through
 * err. Return 0 (value stored, or left untouched when absent/null and not required) or
 * -EINVAL. `path` is the JSON path of obj ("" at the top level). */
#ifndef MOTOR_WIRE_INTERNAL_H
#define MOTOR_WIRE_INTERNAL_H

#include "common/jval.h"
#include "wire/wire.h"

#define WIRE_PATH_MAX 160

enum { WJ_OPT = 0, WJ_REQ = 1 };

/* "<path>.<key>: <message>" (or "<key>: ..." at the top, "<path>: ..." without key). */
void wj_err(struct wire_err *err, const char *path, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Child path "<path>.<key>" / "<path>[i]" into buf. */
const char *wj_path_key(char *buf, size_t cap, const char *path, const char *key);
const char *wj_path_idx(char *buf, size_t cap, const char *path, size_t i);

/* The value at key (NULL when absent or null); when required and missing, reports it. */
json_t *wj_get(json_t *obj, const char *path, const char *key, int req, struct wire_err *err,
               int *rc);

/* String: *out = heap copy (previous value freed). */
int wj_str(json_t *obj, const char *path, const char *key, int req, char **out,
           struct wire_err *err);
/* Non-empty string. */
int wj_str_nonempty(json_t *obj, const char *path, const char *key, int req, char **out,
                    struct wire_err *err);
/* String or non-negative integer, kept as a string. */
int wj_numstr(json_t *obj, const char *path, const char *key, int req, char **out,
              struct wire_err *err);
/* Like wj_numstr, and the value must be a decimal port 1..65535. */
int wj_portstr(json_t *obj, const char *path, const char *key, int req, char **out,
               struct wire_err *err);
/* Validate one value (not an object member) as wj_numstr/wj_portstr do. */
int wj_value_numstr(json_t *v, const char *path, char **out, struct wire_err *err);
int wj_value_portstr(json_t *v, const char *path, char **out, struct wire_err *err);
int wj_value_str(json_t *v, const char *path, char **out, struct wire_err *err);
int wj_value_int(json_t *v, const char *path, int64_t min, int64_t max, int64_t *out,
                 struct wire_err *err);

int wj_int(json_t *obj, const char *path, const char *key, int req, int64_t min, int64_t max,
           int64_t *out, struct wire_err *err);
int wj_int32(json_t *obj, const char *path, const char *key, int req, int min, int max, int *out,
             struct wire_err *err);
int wj_double(json_t *obj, const char *path, const char *key, int req, double min, double max,
              double *out, struct wire_err *err);
int wj_bool(json_t *obj, const char *path, const char *key, int req, bool *out,
            struct wire_err *err);
/* Array (borrowed) of at most WIRE_LIST_MAX elements; *out NULL when absent. */
int wj_array(json_t *obj, const char *path, const char *key, int req, json_t **out,
             struct wire_err *err);
int wj_object(json_t *obj, const char *path, const char *key, int req, json_t **out,
              struct wire_err *err);
/* Array of strings into l (released first). */
int wj_strlist(json_t *obj, const char *path, const char *key, int req, bool ports,
               struct wire_strlist *l, struct wire_err *err);
/* Array of unique-or-not integers into a heap array. */
int wj_intlist(json_t *obj, const char *path, const char *key, int req, int64_t min, int64_t max,
               int64_t **out, size_t *n, struct wire_err *err);
/* The role field ("both" => union). */
int wj_role(json_t *obj, const char *path, const char *key, int req, enum wire_role *out,
            struct wire_err *err);
/* Must be an object: otherwise "<path>: must be a JSON object, got ..." */
int wj_require_object(json_t *j, const char *path, struct wire_err *err);

/* Setters for serializers: skip NULL strings / zero ports. */
void wj_set_str(json_t *o, const char *key, const char *s);
void wj_set_int(json_t *o, const char *key, int64_t v);

/* Path-aware parsers of embedded types (path names the value itself). */
int wire_device_list_parse_at(json_t *arr, const char *path, struct wire_device_info **out,
                              size_t *n, struct wire_err *err);
int wire_endpoint_parse_at(json_t *j, const char *path, unsigned flags, struct wire_endpoint *out,
                           struct wire_err *err);
int wire_endpoint_list_parse_at(json_t *arr, const char *path, unsigned flags,
                                struct wire_endpoint **out, size_t *n, struct wire_err *err);
int wire_parallel_config_parse_at(json_t *j, const char *path, struct wire_parallel_config *out,
                                  struct wire_err *err);
int wire_ft_capability_parse_at(json_t *j, const char *path, struct wire_ft_capability *out,
                                struct wire_err *err);

#endif
