/* The docs' configuration key tables are the tables' own: each block between
 *   <!-- config-keys:NAME -->  and  <!-- /config-keys:NAME -->
 * in the docs (docs/NAME.md) must be exactly what cfgtab_markdown() makes of that table, so a key
 * added, renamed or re-ranged without its docs fails here.
 *
 * Also the generator: `test_config_docs --update` rewrites those blocks in place,
 * `test_config_docs --print NAME` prints one table. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/cfgtab.h"
#include "common/util.h"
#include "controller/ctl_config.h"
#include "coordinator/coord_config.h"
#include "nodemgr/nm_config.h"
#include "nodemgr/nm_internal.h"
#include "pool/pool_internal.h"
#include "unit_helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct doc_table {
    const char *name; /* the marker's NAME */
    const char *file; /* relative to the repository */
    const struct cfgtab *table;
};

static const struct doc_table docs[] = {
    {"node-manager", "docs/node-manager.md", &nm_config_cfgtab},
    {"controller", "docs/controller.md", &ctlcfg_cfgtab},
    {"coordinator", "docs/coordinator.md", &ccfg_cfgtab},
    {"worker-manifest", "docs/worker-pool.md", &pool_manifest_cfgtab},
    {"worker-pool-block", "docs/worker-pool.md", &nm_pool_cfgtab},
};

static char *markdown(const struct doc_table *d)
{
    struct strbuf sb;
    strbuf_init(&sb, 1u << 20);
    cfgtab_markdown(d->table, &sb);
    return strbuf_take(&sb);
}

/* The generated block of d in text: [*start, *end) between the markers' lines. */
static bool find_block(const char *text, const struct doc_table *d, size_t *start, size_t *end)
{
    char *open = xasprintf("<!-- config-keys:%s -->\n", d->name);
    char *close = xasprintf("<!-- /config-keys:%s -->", d->name);
    const char *a = strstr(text, open);
    const char *b = a ? strstr(a, close) : NULL;
    if (a && b) {
        *start = (size_t)(a - text) + strlen(open);
        *end = (size_t)(b - text);
    }
    free(open);
    free(close);
    return a && b;
}

static char *read_doc(const char *rel)
{
    char *path = repo_path(rel);
    size_t len = 0;
    char *text = util_read_file(path, 4u << 20, &len);
    if (!text)
        fail_msg("cannot read %s", path);
    free(path);
    return text;
}

static void test_docs_match_tables(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(docs); i++) {
        char *text = read_doc(docs[i].file);
        size_t a, b;
        if (!find_block(text, &docs[i], &a, &b))
            fail_msg("%s has no <!-- config-keys:%s --> block", docs[i].file, docs[i].name);
        char *want = markdown(&docs[i]);
        if (strlen(want) != b - a || memcmp(text + a, want, b - a) != 0)
            fail_msg("%s: the %s key table differs from the configuration table; regenerate "
                     "it with `test_config_docs --update` (build dir)",
                     docs[i].file, docs[i].name);
        free(want);
        free(text);
    }
}

/* Every key row documents itself: no empty meaning where the built-in text says nothing. */
static void test_rows_are_well_formed(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(docs); i++) {
        const struct cfgtab *t = docs[i].table;
        for (size_t k = 0; k < t->n; k++) {
            const struct cfgtab_row *r = &t->rows[k];
            if (r->type == CFGTAB_GROUP)
                assert_non_null(r->sub);
            if (r->type == CFGTAB_ENUM)
                assert_non_null(r->names);
            if (r->type == CFGTAB_CUSTOM && !(r->flags & CFGTAB_DERIVED))
                assert_true(r->ops && r->ops->parse);
            if (t->src_names == NULL)
                assert_int_equal(r->src, 0);
        }
    }
}

static int update(void)
{
    for (size_t i = 0; i < ARRAY_LEN(docs); i++) {
        char *text = read_doc(docs[i].file);
        size_t a, b;
        if (!find_block(text, &docs[i], &a, &b)) {
            fprintf(stderr, "%s: no <!-- config-keys:%s --> block\n", docs[i].file, docs[i].name);
            free(text);
            return 1;
        }
        char *want = markdown(&docs[i]);
        char *out = xasprintf("%.*s%s%s", (int)a, text, want, text + b);
        char *path = repo_path(docs[i].file);
        int rc = util_write_file_atomic(path, out, strlen(out), 0644);
        if (rc < 0)
            fprintf(stderr, "%s: cannot write\n", path);
        else
            printf("%s: %s\n", docs[i].file, docs[i].name);
        free(path);
        free(out);
        free(want);
        free(text);
        if (rc < 0)
            return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--update") == 0)
        return update();
    if (argc > 2 && strcmp(argv[1], "--print") == 0) {
        for (size_t i = 0; i < ARRAY_LEN(docs); i++) {
            if (strcmp(argv[2], docs[i].name) == 0) {
                char *md = markdown(&docs[i]);
                fputs(md, stdout);
                free(md);
                return 0;
            }
        }
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_docs_match_tables),
        cmocka_unit_test(test_rows_are_well_formed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
