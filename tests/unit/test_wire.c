/* wire: every parser, table-driven (valid inputs with their canonical output, invalid
 * inputs with the exact error), round trips, and the helpers around them.
 *
 * JSON in the tables is written with single quotes (converted to double quotes before
 * parsing) to keep the C strings readable. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/util.h"
#include "wire/wire.h"
#include "wire/wire_ft.h"
#include "wire/wire_msg.h"
#include "wire/wire_ranktable.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------------ */

static json_t *J(const char *squoted)
{
    char *s = xstrdup(squoted);
    for (char *p = s; *p; p++)
        if (*p == '\'')
            *p = '"';
    json_error_t jerr;
    json_t *j = json_loads(s, JSON_DECODE_ANY, &jerr);
    if (!j)
        fail_msg("bad test JSON %s: %s", squoted, jerr.text);
    free(s);
    return j;
}

static void assert_json_eq(json_t *got, json_t *want, const char *ctx)
{
    if (!json_equal(got, want)) {
        char *g = json_dumps(got, JSON_COMPACT | JSON_ENCODE_ANY);
        char *w = json_dumps(want, JSON_COMPACT | JSON_ENCODE_ANY);
        print_error("%s\n  got:  %s\n  want: %s\n", ctx, g, w);
        free(g);
        free(w);
        fail();
    }
}

/* A parser/serializer pair behind one signature, so one table covers every type. */
struct codec {
    const char *name;
    size_t size;
    int (*parse)(json_t *j, void *out, struct wire_err *err);
    json_t *(*to_json)(const void *v);
    void (*release)(void *v);
};

#define CODEC(nm, type, parse_expr, tojson, rel)                                                   \
    static int nm##_parse(json_t *j, void *out, struct wire_err *err)                              \
    {                                                                                              \
        type *o = out;                                                                             \
        return parse_expr;                                                                         \
    }                                                                                              \
    static json_t *nm##_json(const void *v)                                                        \
    {                                                                                              \
        return tojson((const type *)v);                                                            \
    }                                                                                              \
    static void nm##_rel(void *v)                                                                  \
    {                                                                                              \
        rel((type *)v);                                                                            \
    }                                                                                              \
    static const struct codec nm = {#nm, sizeof(type), nm##_parse, nm##_json, nm##_rel};

static void no_release(void *v)
{
    (void)v;
}
static void release_pc(struct wire_parallel_config *p)
{
    no_release(p);
}
static void release_ftc(struct wire_ft_capability *p)
{
    no_release(p);
}
static void release_restart(struct wire_engine_restart_req *p)
{
    no_release(p);
}

CODEC(c_device, struct wire_device_info, wire_device_info_parse(j, o, err),
      wire_device_info_to_json, wire_device_info_release)
CODEC(c_endpoint, struct wire_endpoint, wire_endpoint_parse(j, 0, o, err), wire_endpoint_to_json,
      wire_endpoint_release)
CODEC(c_endpoint_strict, struct wire_endpoint, wire_endpoint_parse(j, WIRE_STRICT_ENDPOINT, o, err),
      wire_endpoint_to_json, wire_endpoint_release)
CODEC(c_parallel, struct wire_parallel_config, wire_parallel_config_parse(j, o, err),
      wire_parallel_config_to_json, release_pc)
CODEC(c_ftcap, struct wire_ft_capability, wire_ft_capability_parse(j, o, err),
      wire_ft_capability_to_json, release_ftc)
CODEC(c_nminfo, struct wire_nm_info, wire_nm_info_parse(j, o, err), wire_nm_info_to_json,
      wire_nm_info_release)
CODEC(c_ranktable, struct wire_ranktable, wire_ranktable_parse(j, o, err), wire_ranktable_to_json,
      wire_ranktable_release)
CODEC(c_start, struct wire_start_cmd, wire_start_cmd_parse(j, 0, o, err), wire_start_cmd_to_json,
      wire_start_cmd_release)
CODEC(c_start_strict, struct wire_start_cmd, wire_start_cmd_parse(j, WIRE_STRICT_ENDPOINT, o, err),
      wire_start_cmd_to_json, wire_start_cmd_release)
CODEC(c_register, struct wire_register, wire_register_parse(j, o, err), wire_register_to_json,
      wire_register_release)
CODEC(c_reregister, struct wire_reregister, wire_reregister_parse(j, 0, o, err),
      wire_reregister_to_json, wire_reregister_release)
CODEC(c_reregister_strict, struct wire_reregister,
      wire_reregister_parse(j, WIRE_STRICT_ENDPOINT, o, err), wire_reregister_to_json,
      wire_reregister_release)
CODEC(c_heartbeat, struct wire_heartbeat, wire_heartbeat_parse(j, o, err), wire_heartbeat_to_json,
      wire_heartbeat_release)
CODEC(c_fault, struct wire_fault_report, wire_fault_report_parse(j, o, err),
      wire_fault_report_to_json, wire_fault_report_release)
CODEC(c_ft_status, struct wire_ft_status_req, wire_ft_status_req_parse(j, o, err),
      wire_ft_status_req_to_json, wire_ft_status_req_release)
CODEC(c_ft_apply, struct wire_ft_apply_req, wire_ft_apply_req_parse(j, o, err),
      wire_ft_apply_req_to_json, wire_ft_apply_req_release)
CODEC(c_ft_guard, struct wire_ft_guard_req, wire_ft_guard_req_parse(j, o, err),
      wire_ft_guard_req_to_json, wire_ft_guard_req_release)
CODEC(c_ft_finalize, struct wire_ft_finalize_req, wire_ft_finalize_req_parse(j, o, err),
      wire_ft_finalize_req_to_json, wire_ft_finalize_req_release)
CODEC(c_restart, struct wire_engine_restart_req, wire_engine_restart_req_parse(j, o, err),
      wire_engine_restart_req_to_json, release_restart)
CODEC(c_ft_entry, struct wire_ft_engine_entry, wire_ft_engine_entry_parse(j, o, err),
      wire_ft_engine_entry_to_json, wire_ft_engine_entry_release)

struct wcase {
    const struct codec *codec;
    const char *in;
    const char *want; /* canonical output; NULL = same as in (valid cases) */
    int rc;           /* 0, -EINVAL or -ERANGE */
    const char *err;  /* exact message for failures */
};

#define OK(c, in, out)                                                                             \
    {                                                                                              \
        &c, in, out, 0, NULL                                                                       \
    }
#define BAD(c, in, msg)                                                                            \
    {                                                                                              \
        &c, in, NULL, -EINVAL, msg                                                                 \
    }
#define RANGE(c, in, msg)                                                                          \
    {                                                                                              \
        &c, in, NULL, -ERANGE, msg                                                                 \
    }

static void run_case(const struct wcase *tc, size_t idx)
{
    char ctx[512];
    snprintf(ctx, sizeof(ctx), "case %zu (%s): %s", idx, tc->codec->name, tc->in);
    json_t *in = J(tc->in);
    void *obj = xcalloc(1, tc->codec->size);
    struct wire_err err = {{0}};
    int rc = tc->codec->parse(in, obj, &err);
    if (rc != tc->rc) {
        print_error("%s\n  rc %d (want %d), error: %s\n", ctx, rc, tc->rc, err.msg);
        fail();
    }
    if (rc < 0) {
        if (strcmp(err.msg, tc->err) != 0) {
            print_error("%s\n  error: %s\n  want:  %s\n", ctx, err.msg, tc->err);
            fail();
        }
        /* A failed parse leaves nothing to free, and releasing is still safe. */
        tc->codec->release(obj);
    } else {
        json_t *out = tc->codec->to_json(obj);
        json_t *want = tc->want ? J(tc->want) : json_incref(in);
        assert_json_eq(out, want, ctx);
        /* Round trip: serialized text parses back to the same value. */
        char *text = json_dumps(out, JSON_COMPACT);
        json_t *again = json_loads(text, 0, NULL);
        void *obj2 = xcalloc(1, tc->codec->size);
        assert_int_equal(tc->codec->parse(again, obj2, &err), 0);
        json_t *out2 = tc->codec->to_json(obj2);
        assert_json_eq(out2, out, ctx);
        tc->codec->release(obj2);
        tc->codec->release(obj);
        free(obj2);
        free(text);
        json_decref(again);
        json_decref(out2);
        json_decref(out);
        json_decref(want);
    }
    free(obj);
    json_decref(in);
}

static void run_table(const struct wcase *cases, size_t n)
{
    for (size_t i = 0; i < n; i++)
        run_case(&cases[i], i);
}

/* ---- tables ------------------------------------------------------------------------- */

#define EP_DEFAULTS                                                                                \
    "'status':'initial','device_infos':[],'hb_timestamp':0.0,'workload':{'active_tokens':0.0},'"   \
    "headless':false"

static const struct wcase embedded_cases[] = {
    /* DeviceInfo */
    OK(c_device, "{'device_id':'0','rank_id':'4','device_ip':'1.2.3.4'}", NULL),
    OK(c_device, "{'device_id':1,'rank_id':2}", "{'device_id':'1','rank_id':'2'}"),
    OK(c_device, "{'device_id':'0','rank_id':'0','device_ip':null,'super_device_id':'7','x':1}",
       "{'device_id':'0','rank_id':'0','super_device_id':'7'}"),
    BAD(c_device, "{'device_id':'0'}", "rank_id: missing"),
    BAD(c_device, "{'device_id':'0','rank_id':null}", "rank_id: must not be null"),
    BAD(c_device, "{'device_id':true,'rank_id':'0'}",
        "device_id: must be a string or an integer, got a boolean"),
    BAD(c_device, "{'device_id':-1,'rank_id':'0'}",
        "device_id: must be a non-negative number, got -1"),
    BAD(c_device, "{'device_id':'0','rank_id':'0','device_ip':5}",
        "device_ip: must be a string, got an integer"),
    BAD(c_device, "[]", "body must be a JSON object, got an array"),

    /* Endpoint, newest shape */
    OK(c_endpoint,
       "{'id':3,'ip':'10.0.0.5','business_port':'10002','bootstrap_port':9100,'status':'normal',"
       "'device_infos':[{'device_id':'0','rank_id':'0','device_ip':'192.168.1.1'}],"
       "'hb_timestamp':1760000000.5,'workload':{'active_tokens':12.0},'headless':true}",
       NULL),
    OK(c_endpoint, "{'id':0,'ip':'10.0.0.5','business_port':'10000'}",
       "{'id':0,'ip':'10.0.0.5','business_port':'10000'," EP_DEFAULTS "}"),
    /* older shape: port, mgmt_port, older workload keys, integer timestamp */
    OK(c_endpoint,
       "{'id':2,'ip':'127.0.0.2','port':'8080','mgmt_port':'8081','hb_timestamp':1758627366,"
       "'workload':{'active_tokens':1,'active_kv_cache':2,'prefill_cost':3}}",
       "{'id':2,'ip':'127.0.0.2','business_port':'8080','status':'initial','device_infos':[],"
       "'hb_timestamp':1758627366.0,'workload':{'active_tokens':1.0},'headless':false}"),
    OK(c_endpoint, "{'id':1,'ip':'h','business_port':'10000','port':'1'}",
       "{'id':1,'ip':'h','business_port':'10000'," EP_DEFAULTS "}"),
    OK(c_endpoint, "{'id':2.0,'ip':'h','business_port':10000,'bootstrap_port':null}",
       "{'id':2,'ip':'h','business_port':'10000'," EP_DEFAULTS "}"),
    BAD(c_endpoint, "{'id':0,'ip':'h'}", "business_port: missing"),
    BAD(c_endpoint, "{'id':0,'ip':'h','business_port':'0'}",
        "business_port: must be a port number 1-65535, got \"0\""),
    BAD(c_endpoint, "{'id':0,'ip':'h','business_port':'10000x'}",
        "business_port: must be a port number 1-65535, got \"10000x\""),
    BAD(c_endpoint, "{'id':0,'ip':'h','business_port':'+80'}",
        "business_port: must be a port number 1-65535, got \"+80\""),
    BAD(c_endpoint, "{'id':0,'ip':'h','port':'abc'}",
        "port: must be a port number 1-65535, got \"abc\""),
    BAD(c_endpoint, "{'id':-1,'ip':'h','business_port':'1'}",
        "id: must be in [0, 2147483647], got -1"),
    BAD(c_endpoint, "{'id':true,'ip':'h','business_port':'1'}",
        "id: must be an integer, got a boolean"),
    BAD(c_endpoint, "{'id':2.5,'ip':'h','business_port':'1'}",
        "id: must be an integer, got a real number"),
    BAD(c_endpoint, "{'id':'1','ip':'h','business_port':'1'}",
        "id: must be an integer, got a string"),
    BAD(c_endpoint, "{'ip':'h','business_port':'1'}", "id: missing"),
    BAD(c_endpoint, "{'id':1,'ip':'','business_port':'1'}", "ip: must not be empty"),
    BAD(c_endpoint, "{'id':1,'ip':'h','business_port':'1','status':'dead'}",
        "status: must be one of \"initial\", \"normal\", \"abnormal\", \"paused\", "
        "\"wait2start\", got \"dead\""),
    BAD(c_endpoint, "{'id':1,'ip':'h','business_port':'1','bootstrap_port':0}",
        "bootstrap_port: must be in [1, 65535], got 0"),
    BAD(c_endpoint,
        "{'id':1,'ip':'h','business_port':'1','device_infos':[{'device_id':'0','rank_id':'0'},"
        "{'device_id':'1'}]}",
        "device_infos[1].rank_id: missing"),
    BAD(c_endpoint, "{'id':1,'ip':'h','business_port':'1','device_infos':[7]}",
        "device_infos[0]: must be a JSON object, got an integer"),
    BAD(c_endpoint, "{'id':1,'ip':'h','business_port':'1','device_infos':{}}",
        "device_infos: must be an array, got an object"),
    BAD(c_endpoint, "{'id':1,'ip':'h','business_port':'1','hb_timestamp':'x'}",
        "hb_timestamp: must be a number, got a string"),
    BAD(c_endpoint, "{'id':1,'ip':'h','business_port':'1','workload':[]}",
        "workload: must be an object, got an array"),
    BAD(c_endpoint, "{'id':1,'ip':'h','business_port':'1','workload':{'active_tokens':-1}}",
        "workload.active_tokens: must be in [0.0, 1e+18], got -1.0"),
    BAD(c_endpoint, "{'id':1,'ip':'h','business_port':'1','headless':1}",
        "headless: must be true or false, got an integer"),
    OK(c_endpoint_strict, "{'id':0,'ip':'h','business_port':'1','headless':false}",
       "{'id':0,'ip':'h','business_port':'1'," EP_DEFAULTS "}"),
    BAD(c_endpoint_strict, "{'id':0,'ip':'h','business_port':'1','mgmt_port':'2'}",
        "unknown field \"mgmt_port\""),
    BAD(c_endpoint_strict, "{'id':0,'ip':'h','port':'1'}", "unknown field \"port\""),

    /* ParallelConfig */
    OK(c_parallel, "{}",
       "{'dp_size':1,'pcp_size':1,'tp_size':1,'ep_size':1,'pp_size':1,'world_size':0,"
       "'local_world_size':0}"),
    OK(c_parallel, "{'dp_size':2,'cp_size':1,'sp_size':1,'tp_size':4,'world_size':8}",
       "{'dp_size':2,'pcp_size':1,'tp_size':4,'ep_size':1,'pp_size':1,'world_size':8,"
       "'local_world_size':0}"),
    BAD(c_parallel, "{'dp_size':0}", "dp_size: must be in [1, 65536], got 0"),
    BAD(c_parallel, "{'tp_size':true}", "tp_size: must be an integer, got a boolean"),
    BAD(c_parallel, "{'world_size':-1}", "world_size: must be in [0, 65536], got -1"),
    BAD(c_parallel, "7", "body must be a JSON object, got an integer"),

    /* FtCapabilitySnapshot */
    OK(c_ftcap, "{}",
       "{'enabled':false,'scale_down_supported':false,'external_lb':false,'auto_recovery':false,"
       "'fused_mc2_enabled':false,'eplb_enabled':false,'num_redundant_experts':0}"),
    OK(c_ftcap,
       "{'enabled':true,'scale_down_supported':true,'external_lb':true,'auto_recovery':false,"
       "'fused_mc2_enabled':true,'eplb_enabled':true,'num_redundant_experts':16}",
       NULL),
    BAD(c_ftcap, "{'enabled':'yes'}", "enabled: must be true or false, got a string"),
    BAD(c_ftcap, "{'num_redundant_experts':-1}",
        "num_redundant_experts: must be in [0, 2147483647], got -1"),

    /* NodeManagerInfo */
    OK(c_nminfo, "{'pod_ip':'10.0.0.5','port':'1026','device_num':16}", NULL),
    OK(c_nminfo, "{'pod_ip':'10.0.0.5','port':1026}",
       "{'pod_ip':'10.0.0.5','port':'1026','device_num':0}"),
    BAD(c_nminfo, "{'pod_ip':'10.0.0.5','port':'0'}",
        "port: must be a port number 1-65535, got \"0\""),
    BAD(c_nminfo, "{'pod_ip':'10.0.0.5','port':'1','device_num':false}",
        "device_num: must be an integer, got a boolean"),
};

static const struct wcase ranktable_cases[] = {
    OK(c_ranktable,
       "{'status':'completed','server_list':[{'device':[{'device_id':'1','device_ip':"
       "'192.168.101.1','rank_id':'0'}],'server_id':'192.168.101.101','container_ip':"
       "'192.168.149.101','hardware_type':'800I-A2-32G'}],'server_count':'1','version':'1.0'}",
       "{'version':'1.0','status':'completed','server_count':'1','server_list':[{'server_id':"
       "'192.168.101.101','container_ip':'192.168.149.101','device':[{'device_id':'1','rank_id':"
       "'0','device_ip':'192.168.101.1'}]}]}"),
    OK(c_ranktable,
       "{'version':'1.2','status':'completed','server_count':2,'super_pod_list':[],"
       "'server_list':[{'server_id':'a','host_ip':'x','device':[{'device_id':0,'rank_id':1,"
       "'super_device_id':'0','device_ip':null}]},{'server_id':'b'}]}",
       "{'version':'1.2','status':'completed','server_count':'2','server_list':[{'server_id':'a',"
       "'device':[{'device_id':'0','rank_id':'1','super_device_id':'0'}]},{'server_id':'b',"
       "'device':[]}]}"),
    OK(c_ranktable, "{'server_list':[]}", NULL),
    BAD(c_ranktable, "{'version':'1.0'}", "server_list: missing"),
    BAD(c_ranktable, "{'server_list':[{'device':[]}]}", "server_list[0].server_id: missing"),
    BAD(c_ranktable,
        "{'server_list':[{'server_id':'a','device':[{'device_id':'0','rank_id':'0'},"
        "{'device_id':'1'}]}]}",
        "server_list[0].device[1].rank_id: missing"),
    BAD(c_ranktable, "{'server_list':[{'server_id':'a','device':{}}]}",
        "server_list[0].device: must be an array, got an object"),
    BAD(c_ranktable, "{'server_list':[],'status':1}", "status: must be a string, got an integer"),
    BAD(c_ranktable, "[]", "body must be a JSON object, got an array"),
};

#define EP0 "{'id':0,'ip':'10.0.0.5','business_port':'10000'}"
#define EP0_OUT "{'id':0,'ip':'10.0.0.5','business_port':'10000'," EP_DEFAULTS "}"

static const struct wcase message_cases[] = {
    /* StartCmdMsg: the spec's example */
    OK(c_start,
       "{'job_name':'qwen-p-0','role':'prefill','instance_id':3,'master_dp_ip':'10.0.0.5',"
       "'node_rank':0,'endpoints':[{'id':0,'ip':'10.0.0.5','business_port':'10000','status':"
       "'initial','device_infos':[{'device_id':'0','rank_id':'0','device_ip':'192.168.1.1'}],"
       "'hb_timestamp':1760000000.0,'workload':{'active_tokens':0.0},'headless':false},"
       "{'id':1,'ip':'10.0.0.5','business_port':'10002','status':'initial','device_infos':[],"
       "'hb_timestamp':1760000000.0,'workload':{'active_tokens':0.0},'headless':false}],"
       "'ranktable':{'version':'1.2','status':'completed','server_count':'1','server_list':"
       "[{'server_id':'10.0.0.5','container_ip':'10.0.0.5','device':[{'device_id':'0',"
       "'rank_id':'0','device_ip':'192.168.1.1'}]}]}}",
       "{'job_name':'qwen-p-0','role':'prefill','instance_id':3,"
       "'endpoints':[{'id':0,'ip':'10.0.0.5','business_port':'10000','status':"
       "'initial','device_infos':[{'device_id':'0','rank_id':'0','device_ip':'192.168.1.1'}],"
       "'hb_timestamp':1760000000.0,'workload':{'active_tokens':0.0},'headless':false},"
       "{'id':1,'ip':'10.0.0.5','business_port':'10002','status':'initial','device_infos':[],"
       "'hb_timestamp':1760000000.0,'workload':{'active_tokens':0.0},'headless':false}],"
       "'master_dp_ip':'10.0.0.5',"
       "'ranktable':{'version':'1.2','status':'completed','server_count':'1','server_list':"
       "[{'server_id':'10.0.0.5','container_ip':'10.0.0.5','device':[{'device_id':'0',"
       "'rank_id':'0','device_ip':'192.168.1.1'}]}]},'node_rank':0}"),
    /* both => union; nulls omitted; node_rank default; d2d [] kept */
    OK(c_start,
       "{'job_name':'j','role':'both','instance_id':1,'endpoints':[" EP0 "],'ranktable':null,"
       "'d2d_peer_ips':null}",
       "{'job_name':'j','role':'union','instance_id':1,'endpoints':[" EP0_OUT "],'node_rank':0}"),
    OK(c_start,
       "{'job_name':'j','role':'decode','instance_id':1,'endpoints':[],'d2d_peer_ips':[],"
       "'node_rank':1,'extra':true}",
       "{'job_name':'j','role':'decode','instance_id':1,'endpoints':[],'d2d_peer_ips':[],"
       "'node_rank':1}"),
    OK(c_start,
       "{'job_name':'j','role':'encode','instance_id':1,'endpoints':[" EP0 "],"
       "'d2d_peer_ips':['0:10.0.0.9','1:10.0.0.8']}",
       "{'job_name':'j','role':'encode','instance_id':1,'endpoints':[" EP0_OUT "],"
       "'d2d_peer_ips':['0:10.0.0.9','1:10.0.0.8'],'node_rank':0}"),
    BAD(c_start, "{'role':'prefill','instance_id':1,'endpoints':[]}", "job_name: missing"),
    BAD(c_start, "{'job_name':'','role':'prefill','instance_id':1,'endpoints':[]}",
        "job_name: must not be empty"),
    BAD(c_start, "{'job_name':'j','role':'master','instance_id':1,'endpoints':[]}",
        "role: must be one of \"encode\", \"prefill\", \"decode\", \"union\", \"both\", got "
        "\"master\""),
    BAD(c_start, "{'job_name':'j','role':'prefill','instance_id':'3','endpoints':[]}",
        "instance_id: must be an integer, got a string"),
    BAD(c_start, "{'job_name':'j','role':'prefill','instance_id':3}", "endpoints: missing"),
    BAD(c_start, "{'job_name':'j','role':'prefill','instance_id':3,'endpoints':{}}",
        "endpoints: must be an array, got an object"),
    BAD(c_start,
        "{'job_name':'j','role':'prefill','instance_id':3,'endpoints':[" EP0 ","
        "{'id':1,'ip':'10.0.0.5','business_port':'65536'}]}",
        "endpoints[1].business_port: must be a port number 1-65535, got \"65536\""),
    BAD(c_start, "{'job_name':'j','role':'prefill','instance_id':3,'endpoints':[" EP0 "," EP0 "]}",
        "endpoints[1].id: duplicate endpoint id 0"),
    BAD(c_start, "{'job_name':'j','role':'prefill','instance_id':3,'endpoints':[],'ranktable':5}",
        "ranktable: must be an object or null, got an integer"),
    BAD(c_start, "{'job_name':'j','role':'prefill','instance_id':3,'endpoints':[],'ranktable':{}}",
        "ranktable.server_list: missing"),
    BAD(c_start,
        "{'job_name':'j','role':'prefill','instance_id':3,'endpoints':[],'d2d_peer_ips':[1]}",
        "d2d_peer_ips[0]: must be a string, got an integer"),
    BAD(c_start, "{'job_name':'j','role':'prefill','instance_id':3,'endpoints':[],'node_rank':-1}",
        "node_rank: must be in [0, 65535], got -1"),
    BAD(c_start,
        "{'job_name':'j','role':'prefill','instance_id':3,'endpoints':[],'master_dp_ip':1}",
        "master_dp_ip: must be a string, got an integer"),
    BAD(c_start, "[]", "body must be a JSON object, got an array"),
    OK(c_start_strict, "{'job_name':'j','role':'prefill','instance_id':3,'endpoints':[" EP0 "]}",
       "{'job_name':'j','role':'prefill','instance_id':3,'endpoints':[" EP0_OUT "],'node_rank':0}"),
    BAD(c_start_strict,
        "{'job_name':'j','role':'prefill','instance_id':3,'endpoints':[{'id':0,'ip':'h',"
        "'business_port':'1','mgmt_port':'2'}]}",
        "endpoints[0]: unknown field \"mgmt_port\""),

    /* RegisterMsg */
    OK(c_register,
       "{'job_name':'qwen-p-0','model_name':'qwen3-8B','engine_type':'vllm',"
       "'dispatch_capabilities':['prefill_handoff_decode'],'ft_capability':{'enabled':true,"
       "'scale_down_supported':true,'external_lb':false,'auto_recovery':false,"
       "'fused_mc2_enabled':false,'eplb_enabled':false,'num_redundant_experts':0},"
       "'role':'prefill','pod_ip':'10.0.0.5','business_port':['10000','10002'],"
       "'bootstrap_port':9100,'nm_port':'1026','parallel_config':{'dp_size':2,'pcp_size':1,"
       "'tp_size':2,'ep_size':1,'pp_size':1,'world_size':4,'local_world_size':2},"
       "'enable_multi_endpoints':true,'device_num':4,'ranktable':{'server_list':[]},"
       "'nnodes':1,'is_master':false}",
       NULL),
    OK(c_register,
       "{'job_name':'j','role':'both','pod_ip':'h','business_port':['10000',10002],"
       "'mgmt_port':['10001'],'nm_port':1026,'engine_type':null,'ranktable':null}",
       "{'job_name':'j','model_name':'','dispatch_capabilities':[],'ft_capability':{'enabled':"
       "false,'scale_down_supported':false,'external_lb':false,'auto_recovery':false,"
       "'fused_mc2_enabled':false,'eplb_enabled':false,'num_redundant_experts':0},'role':"
       "'union','pod_ip':'h','business_port':['10000','10002'],'nm_port':'1026',"
       "'parallel_config':{'dp_size':1,'pcp_size':1,'tp_size':1,'ep_size':1,'pp_size':1,"
       "'world_size':0,'local_world_size':0},'enable_multi_endpoints':true,'device_num':0,"
       "'nnodes':1,'is_master':false}"),
    BAD(c_register,
        "{'job_name':'j','role':'prefill','pod_ip':'h','business_port':['0'],'nm_port':'1'}",
        "business_port[0]: must be a port number 1-65535, got \"0\""),
    BAD(c_register, "{'job_name':'j','role':'prefill','pod_ip':'h','business_port':[]}",
        "nm_port: missing"),
    BAD(c_register,
        "{'job_name':'j','role':'prefill','pod_ip':'h','business_port':[],'nm_port':'1',"
        "'parallel_config':{'dp_size':0}}",
        "parallel_config.dp_size: must be in [1, 65536], got 0"),
    BAD(c_register,
        "{'job_name':'j','role':'prefill','pod_ip':'h','business_port':[],'nm_port':'1',"
        "'ft_capability':{'enabled':1}}",
        "ft_capability.enabled: must be true or false, got an integer"),
    BAD(c_register,
        "{'job_name':'j','role':'prefill','pod_ip':'h','business_port':[],'nm_port':'1',"
        "'nnodes':0}",
        "nnodes: must be in [1, 65536], got 0"),
    BAD(c_register,
        "{'job_name':'j','role':'prefill','pod_ip':'h','business_port':[],'nm_port':'1',"
        "'dispatch_capabilities':'x'}",
        "dispatch_capabilities: must be an array, got a string"),

    /* ReregisterMsg */
    OK(c_reregister,
       "{'job_name':'j','model_name':'m','engine_type':'sglang','dispatch_capabilities':[],"
       "'ft_capability':{'enabled':false,'scale_down_supported':false,'external_lb':false,"
       "'auto_recovery':false,'fused_mc2_enabled':false,'eplb_enabled':false,"
       "'num_redundant_experts':0},'instance_id':7,'role':'decode','pod_ip':'h','nm_port':'1026',"
       "'parallel_config':{'dp_size':1,'pcp_size':1,'tp_size':1,'ep_size':1,'pp_size':1,"
       "'world_size':1,'local_world_size':1},'enable_multi_endpoints':false,'device_num':2,"
       "'endpoints':[" EP0_OUT "],'nnodes':2,'node_rank':1}",
       NULL),
    BAD(c_reregister, "{'job_name':'j','role':'decode','pod_ip':'h','nm_port':'1','endpoints':[]}",
        "instance_id: missing"),
    BAD(c_reregister_strict,
        "{'job_name':'j','instance_id':1,'role':'decode','pod_ip':'h','nm_port':'1',"
        "'endpoints':[{'id':0,'ip':'h','port':'1'}]}",
        "endpoints[0]: unknown field \"port\""),

    /* HeartbeatMsg */
    OK(c_heartbeat,
       "{'job_name':'qwen-p-0','ins_id':3,'ip':'10.0.0.5','status':{'0':'normal','1':'initial',"
       "'7':'wait2start'}}",
       NULL),
    OK(c_heartbeat, "{'job_name':'j','ins_id':0,'ip':'h','status':{'01':'paused'}}",
       "{'job_name':'j','ins_id':0,'ip':'h','status':{'1':'paused'}}"),
    OK(c_heartbeat, "{'job_name':'j','ins_id':0,'ip':'h','status':{}}", NULL),
    BAD(c_heartbeat, "{'job_name':'j','ins_id':0,'ip':'h','status':{'1':'normal','01':'normal'}}",
        "status: duplicate endpoint id 1"),
    BAD(c_heartbeat, "{'job_name':'j','ins_id':0,'ip':'h','status':{'a':'normal'}}",
        "status: key \"a\" is not an endpoint id"),
    BAD(c_heartbeat, "{'job_name':'j','ins_id':0,'ip':'h','status':{'-1':'normal'}}",
        "status: key \"-1\" is not an endpoint id"),
    BAD(c_heartbeat, "{'job_name':'j','ins_id':0,'ip':'h','status':{'0':'ok'}}",
        "status.0: must be one of \"initial\", \"normal\", \"abnormal\", \"paused\", "
        "\"wait2start\""),
    BAD(c_heartbeat, "{'job_name':'j','ins_id':0,'ip':'h'}", "status: missing"),
    BAD(c_heartbeat, "{'job_name':'j','ins_id':true,'ip':'h','status':{}}",
        "ins_id: must be an integer, got a boolean"),
    BAD(c_heartbeat, "{'job_name':'j','ins_id':1,'ip':'h','status':[]}",
        "status: must be an object, got an array"),

    /* software-fault report */
    OK(c_fault,
       "{'exception_type':'EngineDeadError','exception_message':'pid 42 exited','engine_id':1,"
       "'engine_status':1,'pod_ip':'10.0.0.5','instance_id':3,'node_manager_port':1026,"
       "'additional_info':{'pid':42,'signal':9}}",
       NULL),
    OK(c_fault, "{'engine_id':0,'engine_status':2,'pod_ip':'h','instance_id':null}",
       "{'exception_type':'','exception_message':'','engine_id':0,'engine_status':2,"
       "'pod_ip':'h'}"),
    BAD(c_fault, "{'engine_id':0,'engine_status':3,'pod_ip':'h'}",
        "engine_status: must be in [0, 2], got 3"),
    BAD(c_fault, "{'engine_id':'1','engine_status':1,'pod_ip':'h'}",
        "engine_id: must be an integer, got a string"),
    BAD(c_fault, "{'engine_id':1,'engine_status':1}", "pod_ip: missing"),
    BAD(c_fault, "{'engine_status':1,'pod_ip':'h'}", "engine_id: missing"),
    BAD(c_fault, "{'engine_id':1,'engine_status':1,'pod_ip':'h','additional_info':[]}",
        "additional_info: must be an object, got an array"),
    BAD(c_fault, "{'engine_id':1,'engine_status':1,'pod_ip':'h','node_manager_port':0}",
        "node_manager_port: must be in [1, 65535], got 0"),
};

static const struct wcase ft_cases[] = {
    OK(c_ft_status, "{'endpoint_ids':[0,3,2]}", NULL),
    BAD(c_ft_status, "{'endpoint_ids':[]}", "endpoint_ids: must not be empty"),
    BAD(c_ft_status, "{'endpoint_ids':[true]}",
        "endpoint_ids[0]: must be an integer, got a boolean"),
    BAD(c_ft_status, "{'endpoint_ids':'0'}", "endpoint_ids: must be an array, got a string"),
    BAD(c_ft_status, "{}", "endpoint_ids: missing"),
    BAD(c_ft_status, "[]", "body must be a JSON object, got an array"),
    RANGE(c_ft_status, "{'endpoint_ids':[1,2,1]}", "endpoint_ids: duplicate endpoint id 1"),

    OK(c_ft_apply, "{'endpoint_ids':[1],'instruction':'retry','params':{},'request_id':'r1'}",
       NULL),
    OK(c_ft_apply, "{'endpoint_ids':[1],'instruction':'retry','request_id':'r1'}",
       "{'endpoint_ids':[1],'instruction':'retry','params':{},'request_id':'r1'}"),
    OK(c_ft_apply,
       "{'endpoint_ids':[0,1],'instruction':'scale_down','params':{'removed_dp_ranks':[2],"
       "'dp_master_ip':'10.0.0.5','dp_master_rank':0},'request_id':'scale-down-ab'}",
       NULL),
    BAD(c_ft_apply, "{'endpoint_ids':[1],'instruction':'reboot','request_id':'r'}",
        "instruction: must be \"retry\" or \"scale_down\", got \"reboot\""),
    BAD(c_ft_apply, "{'endpoint_ids':[1],'instruction':'retry','params':[],'request_id':'r'}",
        "params: must be an object, got an array"),
    BAD(c_ft_apply, "{'endpoint_ids':[1],'instruction':'retry'}", "request_id: missing"),
    BAD(c_ft_apply, "{'endpoint_ids':[],'instruction':'retry','request_id':'r'}",
        "endpoint_ids: must not be empty"),
    RANGE(c_ft_apply, "{'endpoint_ids':[1],'instruction':'retry','request_id':''}",
          "request_id: must not be empty"),
    RANGE(c_ft_apply, "{'endpoint_ids':[1,1],'instruction':'retry','request_id':'r'}",
          "endpoint_ids: duplicate endpoint id 1"),

    OK(c_ft_guard, "{'request_id':'r1','lease_sec':109.0}", NULL),
    OK(c_ft_guard, "{'request_id':'r1','lease_sec':300}", "{'request_id':'r1','lease_sec':300.0}"),
    RANGE(c_ft_guard, "{'request_id':'r1','lease_sec':0}",
          "lease_sec: must be in (0, 300], got 0.0"),
    RANGE(c_ft_guard, "{'request_id':'r1','lease_sec':300.5}",
          "lease_sec: must be in (0, 300], got 300.5"),
    RANGE(c_ft_guard, "{'request_id':'','lease_sec':5}", "request_id: must not be empty"),
    BAD(c_ft_guard, "{'request_id':'r','lease_sec':'5'}",
        "lease_sec: must be a number, got a string"),
    BAD(c_ft_guard, "{'request_id':'r','lease_sec':true}",
        "lease_sec: must be a number, got a boolean"),
    BAD(c_ft_guard, "{'request_id':'r'}", "lease_sec: missing"),
    BAD(c_ft_guard, "{'lease_sec':1}", "request_id: missing"),
    BAD(c_ft_guard, "5", "body must be a JSON object, got an integer"),

    OK(c_ft_finalize, "{'request_id':'r','retired_endpoint_ids':[],'commit':true}", NULL),
    OK(c_ft_finalize,
       "{'request_id':'r','retired_endpoint_ids':[2,3],'commit':false,'dp_master_rank':0}", NULL),
    OK(c_ft_finalize,
       "{'request_id':'r','retired_endpoint_ids':[2],'commit':true,'dp_master_rank':null}",
       "{'request_id':'r','retired_endpoint_ids':[2],'commit':true}"),
    BAD(c_ft_finalize, "{'request_id':'r','retired_endpoint_ids':['a'],'commit':true}",
        "retired_endpoint_ids[0]: must be an integer, got a string"),
    BAD(c_ft_finalize, "{'request_id':'r','retired_endpoint_ids':[]}", "commit: missing"),
    BAD(c_ft_finalize, "{'request_id':'r','retired_endpoint_ids':[],'commit':'true'}",
        "commit: must be true or false, got a string"),
    BAD(c_ft_finalize, "{'request_id':'r','commit':true}", "retired_endpoint_ids: missing"),
    BAD(c_ft_finalize,
        "{'request_id':'r','retired_endpoint_ids':[],'commit':true,'dp_master_rank':-1}",
        "dp_master_rank: must be in [0, 2147483647], got -1"),
    RANGE(c_ft_finalize, "{'request_id':'r','retired_endpoint_ids':[4,4],'commit':true}",
          "retired_endpoint_ids: duplicate endpoint id 4"),
    RANGE(c_ft_finalize, "{'request_id':'','retired_endpoint_ids':[],'commit':false}",
          "request_id: must not be empty"),

    OK(c_restart, "{'action':'restart'}", NULL),
    OK(c_restart, "{'action':'abort','instance_id':4}", NULL),
    OK(c_restart, "{'action':'restart','instance_id':null}", "{'action':'restart'}"),
    BAD(c_restart, "{'action':'reboot'}",
        "action: must be \"restart\" or \"abort\", got \"reboot\""),
    BAD(c_restart, "{}", "action: missing"),
    BAD(c_restart, "{'action':'restart','instance_id':'x'}",
        "instance_id: must be an integer, got a string"),
    BAD(c_restart, "'restart'", "body must be a JSON object, got a string"),

    OK(c_ft_entry, "{'id':0,'status':'healthy'}", NULL),
    OK(c_ft_entry,
       "{'id':1,'status':'unhealthy','fault_info':{'code':7},'ft_state':'recovering',"
       "'last_ft_request_id':'r','ft_error':'boom','mask':[1,0],'source':'poll'}",
       NULL),
    OK(c_ft_entry, "{'id':1,'status':'dead','ft_state':null,'extra':1}",
       "{'id':1,'status':'dead'}"),
    BAD(c_ft_entry, "{'status':'dead'}", "id: missing"),
    BAD(c_ft_entry, "{'id':1}", "status: missing"),
    BAD(c_ft_entry, "{'id':1,'status':'dead','ft_state':3}",
        "ft_state: must be a string, got an integer"),
};

static void test_embedded_types(void **state)
{
    (void)state;
    run_table(embedded_cases, ARRAY_LEN(embedded_cases));
}

static void test_ranktable_table(void **state)
{
    (void)state;
    run_table(ranktable_cases, ARRAY_LEN(ranktable_cases));
}

static void test_messages(void **state)
{
    (void)state;
    run_table(message_cases, ARRAY_LEN(message_cases));
}

static void test_ft_bodies(void **state)
{
    (void)state;
    run_table(ft_cases, ARRAY_LEN(ft_cases));
}

/* ---- enums -------------------------------------------------------------------------- */

static void test_enums(void **state)
{
    (void)state;
    enum wire_role r;
    assert_int_equal(wire_role_from_str("both", &r), 0);
    assert_int_equal(r, WIRE_ROLE_UNION);
    assert_int_equal(wire_role_from_str("encode", &r), 0);
    assert_int_equal(r, WIRE_ROLE_ENCODE);
    assert_int_equal(wire_role_from_str("Prefill", &r), -EINVAL);
    assert_int_equal(wire_role_from_str(NULL, &r), -EINVAL);
    assert_string_equal(wire_role_str(WIRE_ROLE_DECODE), "decode");
    assert_string_equal(wire_role_str((enum wire_role)9), "?");

    static const char *const ep[] = {"initial", "normal", "abnormal", "paused", "wait2start"};
    for (size_t i = 0; i < ARRAY_LEN(ep); i++) {
        enum wire_ep_status s;
        assert_int_equal(wire_ep_status_from_str(ep[i], &s), 0);
        assert_int_equal(s, (int)i);
        assert_string_equal(wire_ep_status_str(s), ep[i]);
    }
    enum wire_ep_status s;
    assert_int_equal(wire_ep_status_from_str("NORMAL", &s), -EINVAL);

    static const char *const ins[] = {"initial", "inactive", "active", "paused", "deleted"};
    for (size_t i = 0; i < ARRAY_LEN(ins); i++) {
        enum wire_ins_status is;
        assert_int_equal(wire_ins_status_from_str(ins[i], &is), 0);
        assert_string_equal(wire_ins_status_str(is), ins[i]);
    }
    enum wire_engine_status es;
    assert_int_equal(wire_engine_status_from_str("unhealthy", &es), 0);
    assert_int_equal(es, 2);
    assert_int_equal(WIRE_ENGINE_DEAD, 1);
    assert_string_equal(wire_engine_status_str(WIRE_ENGINE_HEALTHY), "healthy");
    enum wire_ft_instruction fi;
    assert_int_equal(wire_ft_instruction_from_str("scale_down", &fi), 0);
    assert_int_equal(fi, WIRE_FT_SCALE_DOWN);
    assert_int_equal(wire_ft_instruction_from_str("scale-down", &fi), -EINVAL);
}

/* ---- helpers around the types ----------------------------------------------------------- */

static void test_parallel_fill(void **state)
{
    (void)state;
    struct wire_parallel_config p = {
        .dp_size = 2, .pcp_size = 2, .tp_size = 4, .ep_size = 1, .pp_size = 1};
    struct wire_err err;
    assert_int_equal(wire_parallel_config_fill(&p, &err), 0);
    assert_int_equal(p.world_size, 16);
    assert_int_equal(p.local_world_size, 8);
    /* given values are kept */
    struct wire_parallel_config q = {.dp_size = 2,
                                     .pcp_size = 1,
                                     .tp_size = 1,
                                     .ep_size = 1,
                                     .pp_size = 1,
                                     .world_size = 5,
                                     .local_world_size = 3};
    assert_int_equal(wire_parallel_config_fill(&q, &err), 0);
    assert_int_equal(q.world_size, 5);
    assert_int_equal(q.local_world_size, 3);
    struct wire_parallel_config big = {
        .dp_size = 65536, .pcp_size = 1, .tp_size = 2, .ep_size = 1, .pp_size = 1};
    assert_int_equal(wire_parallel_config_fill(&big, &err), -ERANGE);
    assert_string_equal(err.msg, "world_size: dp*pcp*tp*pp = 131072 exceeds 65536");
}

static void test_endpoint_copy_and_port(void **state)
{
    (void)state;
    json_t *j = J("{'id':4,'ip':'h','business_port':'10008','device_infos':[{'device_id':'1',"
                  "'rank_id':'9','device_ip':'d'}],'headless':true}");
    struct wire_endpoint e, c;
    struct wire_err err;
    assert_int_equal(wire_endpoint_parse(j, 0, &e, &err), 0);
    assert_int_equal(wire_endpoint_port(&e), 10008);
    wire_endpoint_copy(&c, &e);
    wire_endpoint_release(&e);
    json_t *out = wire_endpoint_to_json(&c);
    json_t *want = J("{'id':4,'ip':'h','business_port':'10008','status':'initial','device_infos':"
                     "[{'device_id':'1','rank_id':'9','device_ip':'d'}],'hb_timestamp':0.0,"
                     "'workload':{'active_tokens':0.0},'headless':true}");
    assert_json_eq(out, want, "copy");
    wire_endpoint_release(&c);
    wire_endpoint_release(NULL);
    assert_int_equal(wire_endpoint_port(NULL), 0);
    json_decref(out);
    json_decref(want);
    json_decref(j);
}

static void test_caps(void **state)
{
    (void)state;
    struct wire_err err;
    /* a string longer than WIRE_STR_MAX */
    char *big = xmalloc(WIRE_STR_MAX + 2);
    memset(big, 'a', WIRE_STR_MAX + 1);
    big[WIRE_STR_MAX + 1] = '\0';
    json_t *j = json_pack("{s:s,s:s,s:s}", "device_id", "0", "rank_id", "0", "device_ip", big);
    struct wire_device_info d;
    assert_int_equal(wire_device_info_parse(j, &d, &err), -EINVAL);
    assert_string_equal(err.msg, "device_ip: too long (4097 bytes, max 4096)");
    json_decref(j);
    free(big);
    /* embedded NUL */
    j = json_object();
    json_object_set_new(j, "device_id", json_stringn("a\0b", 3));
    json_object_set_new(j, "rank_id", json_string("0"));
    assert_int_equal(wire_device_info_parse(j, &d, &err), -EINVAL);
    assert_string_equal(err.msg, "device_id: must not contain NUL characters");
    json_decref(j);
    /* more list elements than WIRE_LIST_MAX */
    json_t *ids = json_array();
    for (int i = 0; i <= WIRE_LIST_MAX; i++)
        json_array_append_new(ids, json_integer(i));
    j = json_pack("{s:o}", "endpoint_ids", ids);
    struct wire_ft_status_req r;
    assert_int_equal(wire_ft_status_req_parse(j, &r, &err), -EINVAL);
    assert_string_equal(err.msg, "endpoint_ids: too many elements (16385, max 16384)");
    json_decref(j);
    /* a NULL err is allowed */
    j = J("{}");
    assert_int_equal(wire_device_info_parse(j, &d, NULL), -EINVAL);
    json_decref(j);
}

static void test_fmt_and_compact(void **state)
{
    (void)state;
    char buf[40];
    wire_fmt_double(0.9, buf, sizeof(buf));
    assert_string_equal(buf, "0.9");
    wire_fmt_double(1.0, buf, sizeof(buf));
    assert_string_equal(buf, "1.0");
    wire_fmt_double(1e16, buf, sizeof(buf));
    assert_string_equal(buf, "1e+16");
    wire_fmt_double(0.1 + 0.2, buf, sizeof(buf));
    assert_string_equal(buf, "0.30000000000000004");
    json_t *j = J("{'a':[1,2.5,true,null,'x\\n'],'b':{'c':0.9}}");
    char *s = wire_json_compact(j);
    assert_string_equal(s, "{\"a\":[1,2.5,true,null,\"x\\n\"],\"b\":{\"c\":0.9}}");
    free(s);
    json_decref(j);
    s = wire_json_compact(NULL);
    assert_string_equal(s, "null");
    free(s);
}

static void test_strlist(void **state)
{
    (void)state;
    struct wire_strlist a = {0}, b;
    wire_strlist_push(&a, "x");
    wire_strlist_push(&a, NULL);
    wire_strlist_copy(&b, &a);
    wire_strlist_release(&a);
    assert_int_equal(b.n, 2);
    assert_string_equal(b.items[0], "x");
    assert_string_equal(b.items[1], "");
    assert_null(b.items[2]);
    wire_strlist_release(&b);
    wire_strlist_release(NULL);
}

/* ---- messages: helpers -------------------------------------------------------------- */

static void test_d2d_peers(void **state)
{
    (void)state;
    struct wire_strlist peers = {0}, out = {0};
    const char *v[] = {"0:10.0.0.1", "1:10.0.0.2", "0:fe80::1",  "x:1.1.1.1",
                       ":2.2.2.2",   "nocolon",    "00:10.0.0.3"};
    for (size_t i = 0; i < ARRAY_LEN(v); i++)
        wire_strlist_push(&peers, v[i]);
    wire_d2d_peers_for(&peers, 0, &out);
    assert_int_equal(out.n, 3);
    assert_string_equal(out.items[0], "10.0.0.1");
    assert_string_equal(out.items[1], "fe80::1");
    assert_string_equal(out.items[2], "10.0.0.3");
    wire_strlist_release(&out);
    wire_d2d_peers_for(&peers, 5, &out);
    assert_int_equal(out.n, 0);
    wire_d2d_peers_for(NULL, 0, &out);
    assert_int_equal(out.n, 0);
    wire_strlist_release(&peers);
}

static void test_start_cmd_copy(void **state)
{
    (void)state;
    json_t *j = J("{'job_name':'j','role':'prefill','instance_id':3,'endpoints':[" EP0 "],"
                  "'master_dp_ip':'m','ranktable':{'server_list':[{'server_id':'s','device':"
                  "[{'device_id':'0','rank_id':'0'}]}]},'d2d_peer_ips':['0:a'],'node_rank':1}");
    struct wire_start_cmd m, c;
    struct wire_err err;
    assert_int_equal(wire_start_cmd_parse(j, 0, &m, &err), 0);
    wire_start_cmd_copy(&c, &m);
    json_t *a = wire_start_cmd_to_json(&m);
    wire_start_cmd_release(&m);
    json_t *b = wire_start_cmd_to_json(&c);
    assert_json_eq(b, a, "start copy");
    wire_start_cmd_release(&c);
    wire_start_cmd_release(NULL);
    json_decref(a);
    json_decref(b);
    json_decref(j);
}

static void test_envelopes(void **state)
{
    (void)state;
    json_t *ok = wire_envelope_new(200, "Software fault reported successfully",
                                   json_pack("{s:b}", "accepted", 1));
    json_t *want = J("{'code':200,'message':'Software fault reported successfully','data':"
                     "{'accepted':true}}");
    assert_json_eq(ok, want, "envelope");
    assert_true(wire_envelope_accepted(ok));
    json_decref(ok);
    json_decref(want);

    json_t *e = wire_envelope_error_new(400, "bad", json_pack("{s:b}", "accepted", 0));
    want = J("{'detail':{'code':400,'message':'bad','data':{'accepted':false}}}");
    assert_json_eq(e, want, "error envelope");
    assert_false(wire_envelope_accepted(e));
    json_decref(e);
    json_decref(want);

    e = wire_envelope_new(200, NULL, NULL);
    want = J("{'code':200,'message':'','data':{}}");
    assert_json_eq(e, want, "empty envelope");
    json_decref(e);
    json_decref(want);

    static const struct {
        const char *body;
        bool accepted;
    } acc[] = {
        {"{'code':200,'message':'Fault tolerance is not enabled'}", false},
        {"{'code':200,'data':{'accepted':true}}", true},
        {"{'data':{'accepted':1}}", false},
        {"{'data':{'accepted':'true'}}", false},
        {"{'data':[]}", false},
        {"[]", false},
    };
    for (size_t i = 0; i < ARRAY_LEN(acc); i++) {
        json_t *b = J(acc[i].body);
        assert_int_equal(wire_envelope_accepted(b), acc[i].accepted);
        json_decref(b);
    }
    assert_false(wire_envelope_accepted(NULL));

    static const struct {
        const char *body;
        bool ok;
    } reg[] = {
        {"{'result':0}", true},    {"{'error':'Instance already registered'}", false},
        {"{'error':null}", false}, {"[]", false},
        {"'ok'", false},
    };
    for (size_t i = 0; i < ARRAY_LEN(reg); i++) {
        json_t *b = J(reg[i].body);
        assert_int_equal(wire_register_reply_ok(b), reg[i].ok);
        json_decref(b);
    }
    assert_false(wire_register_reply_ok(NULL));
}

/* ---- ranktable file ------------------------------------------------------------------- */

static void test_ranktable_write(void **state)
{
    (void)state;
    char dir[] = "/tmp/test_wire_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *path = xasprintf("%s/ranktable.json", dir);
    json_t *j = J("{'version':'1.2','status':'completed','server_count':'1','server_list':"
                  "[{'server_id':'s\\u00e9','device':[{'device_id':'0','rank_id':'0',"
                  "'device_ip':null}]}]}");
    struct wire_ranktable rt;
    struct wire_err err;
    assert_int_equal(wire_ranktable_parse(j, &rt, &err), 0);
    assert_int_equal(wire_ranktable_write_file(&rt, path), 0);
    size_t len;
    char *text = util_read_file(path, 1 << 20, &len);
    assert_non_null(text);
    /* 2-space indent, non-ASCII kept as UTF-8, null omitted, trailing newline */
    assert_string_equal(text, "{\n"
                              "  \"version\": \"1.2\",\n"
                              "  \"status\": \"completed\",\n"
                              "  \"server_count\": \"1\",\n"
                              "  \"server_list\": [\n"
                              "    {\n"
                              "      \"server_id\": \"s\xc3\xa9\",\n"
                              "      \"device\": [\n"
                              "        {\n"
                              "          \"device_id\": \"0\",\n"
                              "          \"rank_id\": \"0\"\n"
                              "        }\n"
                              "      ]\n"
                              "    }\n"
                              "  ]\n"
                              "}\n");
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    free(text);

    /* and it loads back */
    struct wire_ranktable back;
    assert_int_equal(wire_ranktable_load_file(path, &back, &err), 0);
    json_t *a = wire_ranktable_to_json(&rt), *b = wire_ranktable_to_json(&back);
    assert_json_eq(b, a, "reload");
    json_decref(a);
    json_decref(b);
    wire_ranktable_release(&back);

    /* dup */
    struct wire_ranktable *d = wire_ranktable_dup(&rt);
    a = wire_ranktable_to_json(d);
    b = wire_ranktable_to_json(&rt);
    assert_json_eq(a, b, "dup");
    json_decref(a);
    json_decref(b);
    wire_ranktable_free(d);
    assert_null(wire_ranktable_dup(NULL));
    wire_ranktable_free(NULL);

    /* load errors */
    char *missing = xasprintf("%s/nope.json", dir);
    assert_int_equal(wire_ranktable_load_file(missing, &back, &err), -ENOENT);
    char *want = xasprintf("%s: cannot read: No such file or directory", missing);
    assert_string_equal(err.msg, want);
    free(want);
    char *bad = xasprintf("%s/bad.json", dir);
    assert_int_equal(util_write_file_atomic(bad, "{\"server_list\": 1}", 18, 0644), 0);
    assert_int_equal(wire_ranktable_load_file(bad, &back, &err), -EINVAL);
    want = xasprintf("%s: server_list: must be an array, got an integer", bad);
    assert_string_equal(err.msg, want);
    free(want);
    assert_int_equal(util_write_file_atomic(bad, "{", 1, 0644), 0);
    assert_int_equal(wire_ranktable_load_file(bad, &back, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "line 1"));
    /* writing into a missing directory fails cleanly */
    char *nodir = xasprintf("%s/no/such/dir.json", dir);
    assert_true(wire_ranktable_write_file(&rt, nodir) < 0);

    unlink(bad);
    unlink(path);
    rmdir(dir);
    free(nodir);
    free(bad);
    free(missing);
    free(path);
    wire_ranktable_release(&rt);
    json_decref(j);
}

/* ---- FT helpers ----------------------------------------------------------------------- */

static void test_ft_apply_engine_body(void **state)
{
    (void)state;
    struct wire_err err;
    struct wire_ft_apply_req r;
    json_t *j = J("{'endpoint_ids':[0,1],'instruction':'scale_down','params':{'removed_dp_ranks':"
                  "[2],'dp_master_ip':'10.0.0.5','dp_master_rank':3},'request_id':'scale-down-1'}");
    assert_int_equal(wire_ft_apply_req_parse(j, &r, &err), 0);
    json_t *body = wire_ft_apply_engine_body(&r, 29500, &err);
    json_t *want = J("{'instruction':'scale_down','params':{'removed_dp_ranks':[2],"
                     "'dp_master_ip':'10.0.0.5','dp_store_port':29503},'request_id':"
                     "'scale-down-1'}");
    assert_json_eq(body, want, "scale_down body");
    json_decref(body);
    json_decref(want);
    /* the request itself is untouched */
    assert_int_equal(json_integer_value(json_object_get(r.params, "dp_master_rank")), 3);
    /* port overflow */
    assert_null(wire_ft_apply_engine_body(&r, 65534, &err));
    assert_string_equal(err.msg, "params.dp_master_rank: dp_store_port = dp_master_port 65534 "
                                 "+ rank 3 is not a valid port");
    wire_ft_apply_req_release(&r);
    json_decref(j);

    /* rank absent => the master port itself */
    j = J("{'endpoint_ids':[0],'instruction':'scale_down','params':{},'request_id':'r'}");
    assert_int_equal(wire_ft_apply_req_parse(j, &r, &err), 0);
    body = wire_ft_apply_engine_body(&r, 29500, &err);
    want = J("{'instruction':'scale_down','params':{'dp_store_port':29500},'request_id':'r'}");
    assert_json_eq(body, want, "no rank");
    json_decref(body);
    json_decref(want);
    wire_ft_apply_req_release(&r);
    json_decref(j);

    /* bad rank */
    j = J("{'endpoint_ids':[0],'instruction':'scale_down','params':{'dp_master_rank':'2'},"
          "'request_id':'r'}");
    assert_int_equal(wire_ft_apply_req_parse(j, &r, &err), 0);
    assert_null(wire_ft_apply_engine_body(&r, 29500, &err));
    assert_string_equal(err.msg, "params.dp_master_rank: must be an integer, got a string");
    wire_ft_apply_req_release(&r);
    json_decref(j);

    /* retry: params forwarded as they are */
    j = J("{'endpoint_ids':[0],'instruction':'retry','params':{'dp_master_rank':1},"
          "'request_id':'r'}");
    assert_int_equal(wire_ft_apply_req_parse(j, &r, &err), 0);
    body = wire_ft_apply_engine_body(&r, 29500, &err);
    want = J("{'instruction':'retry','params':{'dp_master_rank':1},'request_id':'r'}");
    assert_json_eq(body, want, "retry");
    json_decref(body);
    json_decref(want);
    wire_ft_apply_req_release(&r);
    json_decref(j);
}

static void test_ft_engines(void **state)
{
    (void)state;
    struct wire_err err;
    struct wire_ft_engines l;
    json_t *j = J("{'engines':[{'id':0,'status':'healthy'},{'id':1,'status':'unhealthy',"
                  "'fault_info':{'x':1},'ft_state':'recovering'},{'id':2,'status':'dead'},"
                  "{'id':3,'status':'weird'}]}");
    assert_int_equal(wire_ft_engines_parse(j, &l, &err), 0);
    assert_int_equal(l.n, 4);
    assert_int_equal(l.v[0].state, WIRE_FT_HEALTHY);
    assert_int_equal(l.v[1].state, WIRE_FT_UNHEALTHY);
    assert_int_equal(l.v[2].state, WIRE_FT_DEAD);
    assert_int_equal(l.v[3].state, WIRE_FT_OTHER);
    assert_string_equal(l.v[3].status, "weird");
    const struct wire_ft_engine_entry *e = wire_ft_engines_find(&l, 1);
    assert_non_null(e);
    assert_string_equal(e->ft_state, "recovering");
    assert_null(wire_ft_engines_find(&l, 9));
    char *sig = wire_ft_engine_entry_signature(e);
    assert_string_equal(sig, "[\"unhealthy\",{\"x\":1},\"recovering\",null,null,null]");
    free(sig);
    wire_ft_engines_release(&l);
    json_decref(j);

    j = J("{'engines':[{'id':0}]}");
    assert_int_equal(wire_ft_engines_parse(j, &l, &err), -EINVAL);
    assert_string_equal(err.msg, "engines[0].status: missing");
    json_decref(j);
    j = J("{'engine':[]}");
    assert_int_equal(wire_ft_engines_parse(j, &l, &err), -EINVAL);
    assert_string_equal(err.msg, "engines: missing");
    json_decref(j);

    /* the proxy's reply, including its poll-error entry */
    json_t *pe = wire_ft_poll_error_entry(5, "timeout");
    json_t *want = J("{'id':5,'status':'unknown','fault_info':'timeout','source':'poll_error'}");
    assert_json_eq(pe, want, "poll error entry");
    json_decref(want);
    j = json_pack("{s:o,s:{s:s}}", "5", pe, "2", "status", "healthy");
    assert_int_equal(wire_ft_status_reply_parse(j, &l, &err), 0);
    assert_int_equal(l.n, 2);
    assert_int_equal(wire_ft_engines_find(&l, 5)->state, WIRE_FT_UNKNOWN);
    assert_string_equal(wire_ft_engines_find(&l, 5)->source, "poll_error");
    assert_int_equal(wire_ft_engines_find(&l, 2)->id, 2);
    wire_ft_engines_release(&l);
    json_decref(j);
    j = J("{'x':{'status':'healthy'}}");
    assert_int_equal(wire_ft_status_reply_parse(j, &l, &err), -EINVAL);
    assert_string_equal(err.msg, "key \"x\" is not an endpoint id");
    json_decref(j);
    j = J("{'1':{'id':1}}");
    assert_int_equal(wire_ft_status_reply_parse(j, &l, &err), -EINVAL);
    assert_string_equal(err.msg, "1.status: missing");
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedded_types),
        cmocka_unit_test(test_ranktable_table),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_ft_bodies),
        cmocka_unit_test(test_enums),
        cmocka_unit_test(test_parallel_fill),
        cmocka_unit_test(test_endpoint_copy_and_port),
        cmocka_unit_test(test_caps),
        cmocka_unit_test(test_fmt_and_compact),
        cmocka_unit_test(test_strlist),
        cmocka_unit_test(test_d2d_peers),
        cmocka_unit_test(test_start_cmd_copy),
        cmocka_unit_test(test_envelopes),
        cmocka_unit_test(test_ranktable_write),
        cmocka_unit_test(test_ft_apply_engine_body),
        cmocka_unit_test(test_ft_engines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
