/* libFuzzer: an engine's answer through the logprobs projection (lpproj.h), checked
 * against a reference projection built with jansson on the parsed tree: for any valid
 * JSON without duplicate keys the splice must succeed, parse, and equal the reference.
 * The first byte picks the shape, strip and the client's count. */
#include "common/strbuf.h"
#include "coordinator/lpproj.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void trim_array(json_t *a, size_t keep)
{
    while (json_is_array(a) && json_array_size(a) > keep)
        json_array_remove(a, json_array_size(a) - 1);
}

static void trim_object(json_t *o, size_t keep)
{
    if (!json_is_object(o) || json_object_size(o) <= keep)
        return;
    const char *k;
    json_t *v;
    void *tmp;
    size_t i = 0;
    json_object_foreach_safe(o, tmp, k, v)
    {
        if (i++ >= keep)
            json_object_del(o, k);
    }
}

/* The sampled entry first, then the others by rank: k + 1 entries when the k-th other
 * is more likely than the sampled one (it ranked below k), else k; 1 for k = 0. */
static size_t dict_keep(json_t *o, size_t k)
{
    if (k == 0)
        return 1;
    const char *key;
    json_t *v;
    size_t i = 0;
    double lp0 = 0, lpk = 0;
    bool have = false;
    json_object_foreach(o, key, v)
    {
        if (i == 0 || i == k) {
            if (!json_is_number(v))
                return k + 1;
            if (i == 0)
                lp0 = json_number_value(v);
            else {
                lpk = json_number_value(v);
                have = true;
            }
        }
        if (++i > k)
            break;
    }
    return have && lpk > lp0 ? k + 1 : have ? k : k + 1;
}

static void reference(const struct lpproj *p, json_t *root)
{
    json_t *choices = json_object_get(root, "choices");
    size_t i, j;
    json_t *c, *e;
    if (!json_is_array(choices))
        return;
    json_array_foreach(choices, i, c)
    {
        json_t *lp = json_object_get(c, "logprobs");
        if (!json_is_object(c) || !lp)
            continue;
        if (p->strip) {
            json_object_set_new(c, "logprobs", json_null());
            continue;
        }
        if (!json_is_object(lp))
            continue;
        if (p->chat) {
            json_t *content = json_object_get(lp, "content");
            if (json_is_array(content))
                json_array_foreach(content, j, e) if (json_is_object(e))
                    trim_array(json_object_get(e, "top_logprobs"), (size_t)p->top);
        } else {
            json_t *tops = json_object_get(lp, "top_logprobs");
            if (json_is_array(tops))
                json_array_foreach(tops, j, e) trim_object(e, dict_keep(e, (size_t)p->top));
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    struct lpproj p = {.chat = data[0] & 1, .strip = data[0] & 2, .top = (data[0] >> 2) % 8};
    const char *in = (const char *)data + 1;
    size_t n = size - 1;
    struct strbuf sb;
    strbuf_init(&sb, 4 * n + 64);
    int rc = lpproj_rewrite(&p, in, n, &sb);
    /* jansson reads a NUL byte between tokens as the end of its input and accepts
     * what came before ("null\0}" is null): no reference for such input. */
    json_t *j = memchr(in, '\0', n) ? NULL : json_loadb(in, n, JSON_REJECT_DUPLICATES, NULL);
    if (j && json_is_object(j)) {
        if (rc != 0)
            abort();
        json_t *got = json_loadb(strbuf_str(&sb), sb.len, 0, NULL);
        reference(&p, j);
        if (!got || !json_equal(got, j))
            abort();
        json_decref(got);
    } else if (rc != 0 && rc != -EINVAL) {
        abort();
    }
    json_decref(j);
    strbuf_release(&sb);
    return 0;
}
