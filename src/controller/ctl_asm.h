/* ctl_asm — the assembly rules (spec §5.2, §5.3, §5.7): registrations into instances,
 * readiness, node ranks and headless slaves, the instance ranktable and the start
 * command of each node manager.
 *
 * Pure functions over struct ctl_inst (no I/O): the daemon drives them from its
 * reactor (probes, timers, HTTP) and the unit tests call them directly. */
#ifndef MOTOR_CTL_ASM_H
#define MOTOR_CTL_ASM_H

#include "controller/ctl_inst.h"

#include "wire/wire_msg.h"

#include <jansson.h>
#include <stdbool.h>

/* A new (not yet assembled) instance from the first registration of a job. m is
 * copied. hb_now_s: wall seconds stamped as the endpoints' hb_timestamp. NULL with err
 * set when the registration cannot yield endpoints (e.g. device_num below
 * local_world_size, no business port). */
struct ctl_inst *ctl_asm_new(int64_t id, const struct wire_register *m, double hb_now_s,
                             struct wire_err *err);

/* Add a registration of the same job. Endpoint ids continue from the number of
 * endpoints already registered (global DP ranks in registration order).
 * Returns 0 (added), 1 (this pod — same pod IP and NM port — is already registered:
 * acknowledged without changes) or -EINVAL (role / model / dp size differ from the
 * instance's, or no endpoints; message in err). A pod whose ft_capability differs from
 * the first one's clears ft_cap_consistent (DP scale-down then fails closed). */
int ctl_asm_add(struct ctl_inst *in, const struct wire_register *m, double hb_now_s,
                struct wire_err *err);

/* Drop node manager idx (it did not answer the reachability probe) and renumber the
 * endpoints of the remaining ones from their registrations. */
void ctl_asm_remove_nm(struct ctl_inst *in, size_t idx, double hb_now_s);

/* Readiness (§5.3): cross-node (nnodes > 1): #NMs >= ceil(dp / endpoints of the first
 * NM) * nnodes; multi-endpoint: #endpoints >= dp_size; otherwise #NMs >=
 * ceil(world_size / device_num of the first NM). *why (may be NULL) gets a static
 * description of what is missing. */
bool ctl_asm_ready(const struct ctl_inst *in, const char **why);

/* Assemble a ready instance: master_dp_ip = first registered NM's pod IP, node_rank =
 * registration index (modulo nnodes when nnodes > 1), endpoints of slave NMs (index %
 * nnodes != 0) headless, instance ranktable = the pods' server lists concatenated.
 * Registrations are kept (reg) so that the store can rebuild pending assemblies; this
 * call drops them. */
void ctl_asm_finalize(struct ctl_inst *in);

/* Re-registration (§5.7): a new instance with the given id from the first NM that
 * re-registers, or the NM added to one being rebuilt. Endpoints are the NM's own (with
 * their ids), headless when node_rank != 0. ctl_asm_add_rereg returns 0 (added), 1
 * (already present: endpoints refreshed) or -EINVAL (job/role mismatch, endpoint id
 * taken by another pod). */
struct ctl_inst *ctl_asm_new_rereg(const struct wire_reregister *m, double hb_now_s);
int ctl_asm_add_rereg(struct ctl_inst *in, const struct wire_reregister *m, double hb_now_s,
                      struct wire_err *err);
/* Order the NMs by node rank then lowest endpoint id and set master_dp_ip. */
void ctl_asm_finalize_rereg(struct ctl_inst *in);

/* The StartCmdMsg (§5.4) for node manager idx, dumped without nulls. d2d may be NULL
 * (no peers => null). New reference. */
json_t *ctl_asm_start_cmd_json(const struct ctl_inst *in, size_t idx,
                               const struct wire_strlist *d2d);

#endif
