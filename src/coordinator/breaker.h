/* breaker — a per-instance circuit breaker (spec §9.4), as a pure state machine.
 *
 *   closed --(threshold consecutive failures)--> open (timeout T, trip_count++)
 *   open --(T elapsed, next acquire)--> half_open: exactly one trial request admitted
 *   half_open --trial success--> closed (T back to the base)
 *   half_open --trial failure--> open with T doubled (capped at max)
 *   closed --success--> failure count reset
 *
 * Outcomes of requests admitted before a trip (non-trial, while open/half-open) are
 * ignored: only the trial decides. Time is passed in (CLOCK_MONOTONIC ms) so tests can
 * drive it. Not thread-safe: the owner serializes (struct inst_shared has a mutex). */
#ifndef MOTOR_BREAKER_H
#define MOTOR_BREAKER_H

#include <stdbool.h>
#include <stdint.h>

enum brk_state { BRK_CLOSED = 0, BRK_OPEN, BRK_HALF_OPEN };

struct brk_params {
    int threshold;       /* consecutive failures that trip (>= 1) */
    int64_t open_ms;     /* first open period */
    int64_t max_open_ms; /* cap of the doubling */
};

struct brk {
    struct brk_params p;
    enum brk_state state;
    int failures;        /* consecutive, while closed */
    int trip_count;      /* times it opened */
    int64_t cur_open_ms; /* the current (or next) open period */
    int64_t open_until;  /* when open: end of the period */
    bool trial_out;      /* half-open: the trial request is in flight */
};

void brk_init(struct brk *b, const struct brk_params *p);
/* New parameters (hot reload): the state is kept; a closed breaker's next open period
 * starts from the new base, an open one finishes its current period. */
void brk_set_params(struct brk *b, const struct brk_params *p);
/* Would a request be admitted now? (no state change) */
bool brk_peek(const struct brk *b, int64_t now_ms);
/* Admit a request: true when closed, or when this call claims the half-open trial
 * (*trial set). False while open or while the trial is out. */
bool brk_acquire(struct brk *b, int64_t now_ms, bool *trial);
void brk_success(struct brk *b, bool trial);
/* Returns true when this failure opened the breaker. */
bool brk_failure(struct brk *b, int64_t now_ms, bool trial);
/* An admitted request ended with no verdict (client gone, cancelled): frees the trial. */
void brk_abandon(struct brk *b, bool trial);
/* The state as observed at now (open whose period elapsed reads as half_open). */
enum brk_state brk_state_at(const struct brk *b, int64_t now_ms);
const char *brk_state_name(enum brk_state s);

#endif
