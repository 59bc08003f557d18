/* libFuzzer: an engine's answer (a whole body, or SSE chunks split at newlines) through
 * the precision checker's accumulator and every detector (qcheck.h). The engine is an
 * untrusted peer here. Checks the promises the coordinator relies on: the caps hold,
 * a malformed part makes the sample invalid, an invalid sample is never judged bad, the
 * measured shares stay in 0..1, and the code-point counters agree with each other. The
 * first input byte picks the top-k the detectors are enabled for and the caps. */
#include "coordinator/qcheck.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned mode = data[0];
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    struct qck_params prm;
    qck_params_default(&prm);
    prm.garbled = mode & 1;
    prm.rare = mode & 2;
    prm.min_tokens = 1 + (int)((mode >> 2) & 7);
    size_t max_tokens = (mode & 0x20) ? 8 : 4096, max_text = (mode & 0x40) ? 16 : 65536;
    struct qck_acc a;
    qck_acc_init(&a, max_tokens, max_text);
    /* each line one response part, as the SSE data lines of a stream */
    bool any_bad = false;
    for (size_t off = 0; off < n;) {
        const char *nl = memchr(p + off, '\n', n - off);
        size_t len = nl ? (size_t)(nl - (p + off)) : n - off;
        json_t *j = json_loadb(p + off, len, 0, NULL);
        if (j) {
            if (!qck_acc_add_response(&a, j))
                any_bad = true;
            json_decref(j);
        }
        off += len + 1;
    }
    if (a.n > max_tokens || a.text_len > max_text || any_bad != a.malformed)
        abort();
    for (size_t i = 0; i < a.n; i++)
        if (a.tok[i].n_top < 0 || a.tok[i].n_top > QCK_MAX_TOP || !(a.tok[i].logprob <= 0.0))
            abort();
    struct qck_verdict v;
    qck_check(&a, &prm, &v);
    if (!v.valid && v.bad)
        abort();
    if (a.malformed && v.valid)
        abort();
    if (v.low_conf_share < 0.0 || v.low_conf_share > 1.0 || v.rare_share < 0.0 ||
        v.rare_share > 1.0 || v.distinct_4gram < 0.0 || v.distinct_4gram > 1.0)
        abort();
    if (v.repeat_tokens > a.n || v.low_conf_run > a.n)
        abort();
    size_t total;
    size_t rare = qck_rare_chars(a.text, a.text_len, &prm.common, &total);
    if (rare > total || qck_invalid_chars(a.text, a.text_len) > a.text_len)
        abort();
    /* the raw input as content text: the counters never read past it */
    size_t t2;
    if (qck_rare_chars(p, n, &prm.common, &t2) > t2 || qck_invalid_chars(p, n) > n)
        abort();
    struct qck_charset cs;
    char err[128], *s = strndup(p, n < 256 ? n : 256);
    if (qck_charset_parse(&cs, s, err, sizeof(err)) == 0 && (cs.n < 1 || cs.n > QCK_MAX_RANGES))
        abort();
    free(s);
    qck_acc_release(&a);
    return 0;
}
