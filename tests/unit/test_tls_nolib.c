/* TLS without libssl: an https request completes with a clear error (dynlib's message),
 * a TLS listener refuses to start with ENOTSUP, plain HTTP keeps working, nothing
 * crashes. libssl is made unloadable by defining dlopen in this executable: motor_core
 * is linked statically, so dynlib's dlopen binds to this one, which refuses libssl and
 * forwards everything else. (This test must not link OpenSSL itself.) */
#include "common/httpc.h"
#include "common/httpd.h"
#include "common/log.h"
#include "common/reactor.h"
#include "common/tls.h"
#include "common/util.h"

#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static int ssl_attempts;

void *dlopen(const char *file, int mode)
{
    if (file && strstr(file, "libssl")) {
        ssl_attempts++;
        return NULL;
    }
    void *(*real)(const char *, int) = (void *(*)(const char *, int))dlsym(RTLD_NEXT, "dlopen");
    return real ? real(file, mode) : NULL;
}

struct res {
    int ncalls;
    int error;
    char text[512];
};

static void on_done(const struct httpc_response *resp, void *arg)
{
    struct res *x = arg;
    x->ncalls++;
    x->error = resp->error;
    snprintf(x->text, sizeof(x->text), "%s", resp->error_text);
}

static void run_until(struct reactor *r, const int *counter, int ms)
{
    int64_t deadline = util_mono_ms() + ms;
    while (*counter < 1 && util_mono_ms() < deadline)
        reactor_run_once(r, 10);
}

static void test_https_without_libssl(void **state)
{
    (void)state;
    struct reactor *r = reactor_new();
    struct httpc *c = httpc_new(r);
    assert_non_null(c);
    for (int i = 0; i < 2; i++) {
        struct res x = {0};
        httpc_get(c, "https://127.0.0.1:1/x", 2000, on_done, &x);
        assert_int_equal(x.ncalls, 0); /* never from inside httpc_request */
        run_until(r, &x.ncalls, 3000);
        assert_int_equal(x.ncalls, 1);
        assert_int_equal(x.error, -EIO);
        assert_non_null(strstr(x.text, "is not available"));
    }
    assert_true(ssl_attempts >= 1);
    assert_false(tls_loaded());
    /* plain http does not need libssl */
    struct res y = {0};
    httpc_get(c, "http://127.0.0.1:1/x", 2000, on_done, &y);
    run_until(r, &y.ncalls, 3000);
    assert_int_equal(y.ncalls, 1);
    assert_int_equal(y.error, -ECONNREFUSED);
    assert_int_equal(httpc_active(c), 0);
    httpc_free(c);
    reactor_free(r);
}

static void test_tls_listener_without_libssl(void **state)
{
    (void)state;
    struct reactor *r = reactor_new();
    /* the files need not exist: libssl is the first thing missing */
    struct httpd_config cfg = {.name = "t-nolib",
                               .tls_cert_file = "/nonexistent/srv.crt",
                               .tls_key_file = "/nonexistent/srv.key"};
    errno = 0;
    assert_null(httpd_new(r, &cfg));
    assert_int_equal(errno, ENOTSUP);
    struct httpd_config plain = {.name = "t-nolib-plain"};
    struct httpd *h = httpd_new(r, &plain);
    assert_non_null(h);
    assert_false(httpd_is_tls(h));
    httpd_free(h);
    reactor_free(r);
}

int main(void)
{
    log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_https_without_libssl),
        cmocka_unit_test(test_tls_listener_without_libssl),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
