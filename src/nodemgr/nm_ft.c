/* nm_ft — engine FT manager and DP scale-down proxy (§2.10, §8.3).
 *
 * Stub: the four proxy routes exist and answer 404 {"detail":"fault tolerance proxy
 * disabled"} while the proxy switch (Controller enable_fault_tolerance &&
 * enable_dp_scale_down) is off, and 501 when it is on (not implemented here). The FT
 * helper replaces this file (deliverable 7) keeping the nm_ft_* contract of
 * nm_internal.h. Upstream checks the switch before parsing for guard and after parsing
 * for the others; with nothing to parse here both orders answer the same. */
#include "nodemgr/nm_internal.h"

#include "common/log.h"

static void ft_route(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    if (!nm->cfg->ft.enable_dp_scale_down_proxy) {
        httpd_respond_error(req, 404, "fault tolerance proxy disabled");
        return;
    }
    httpd_respond_error(req, 501, "fault tolerance proxy not implemented");
}

int nm_ft_init(struct nodemgr *nm)
{
    static const char *const paths[] = {
        "/node-manager/fault-tolerance/status",
        "/node-manager/fault-tolerance/apply",
        "/node-manager/fault-tolerance/guard",
        "/node-manager/fault-tolerance/finalize",
    };
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
        nm_route(nm, "POST", paths[i], ft_route, nm, HTTPD_ROUTE_AUTH);
    nm->ft = NULL;
    return 0;
}

void nm_ft_free(struct nodemgr *nm)
{
    nm->ft = NULL;
}

void nm_ft_engines_ready(struct nodemgr *nm)
{
    if (nm->cfg->ft.enable_fault_tolerance)
        log_info("ft_polling_not_implemented");
}

void nm_ft_pause(struct nodemgr *nm)
{
    (void)nm;
}

void nm_ft_resume(struct nodemgr *nm)
{
    (void)nm;
}

void nm_ft_endpoints_reset(struct nodemgr *nm)
{
    (void)nm;
}

void nm_ft_config_updated(struct nodemgr *nm)
{
    (void)nm;
}

void nm_ft_stop(struct nodemgr *nm)
{
    (void)nm;
}
