/* reqfsm — the state table of one proxied request (struct preq in proxy.c).
 *
 *   ROUTING    picking a route from the worker's snapshot (synchronous: never observed
 *              by a timer or a callback, except on the defensive client-gone path)
 *   TOKENIZING kv_cache_affinity / compute_length: an engine's /tokenize is asked for the
 *              prompt's token ids before the first route (tokenize_timeout bounds it)
 *   PREFILL    vLLM hand-off: the prefill leg is in flight, the decode leg waits for
 *              its ticket
 *   DECODE     the main leg (decode, or the single leg of a union / hybrid route) is in
 *              flight and has not answered 2xx yet; SGLang's prefill leg runs alongside
 *   BUFFERING  the main leg answers 2xx to a non-streamed request: its body is being
 *              buffered, nothing has reached the client (still retried on failure)
 *   STREAMING  the response head went to the client (committed): from here a failure
 *              can only end the stream in-band
 *   BACKOFF    an attempt failed before anything reached the client; the retry timer
 *              runs
 *   RESUMING   a streamed answer's leg failed after the head went out and the answer is
 *              being continued elsewhere (mid-stream rescheduling): the continuation's
 *              legs are routed, in flight or backing off, none has answered yet; its
 *              first byte returns to STREAMING, a failure can only end the stream
 *   DONE       answered (or the client went away); absorbing
 *
 * Every event names what happened; data-dependent choices (retry or give up, stream or
 * not) are made by the caller and expressed as distinct events, so the table alone
 * decides the new state. Pure and thread-agnostic: the proxy owns one struct reqfsm per
 * request and one struct reqfsm_stats per worker (written by that worker only, read by
 * whichever thread renders /metrics). */
#ifndef MOTOR_REQFSM_H
#define MOTOR_REQFSM_H

#include "common/log.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct strbuf;

enum reqfsm_state {
    REQ_ROUTING = 0,
    REQ_PREFILL,
    REQ_DECODE,
    REQ_BUFFERING,
    REQ_STREAMING,
    REQ_BACKOFF,
    REQ_RESUMING,
    REQ_TOKENIZING,
    REQ_DONE, /* last: the states before it are the live ones */
};
#define REQ_STATE_COUNT 9

enum reqfsm_event {
    REQ_EV_HANDOFF = 0,   /* ROUTING: a vLLM PD pair, the prefill leg sent */
    REQ_EV_SENT,          /* ROUTING: the main leg sent (SGLang: with its prefill leg) */
    REQ_EV_TICKET,        /* PREFILL: the prefill answered a ticket, decode leg sent */
    REQ_EV_PREFILL_DONE,  /* SGLang: the prefill leg ended well, or after the main leg
                             answered (its outcome then only feeds its breaker) */
    REQ_EV_BODY_START,    /* first byte of a 2xx answer to a non-streamed request */
    REQ_EV_STREAM_START,  /* first byte of a 2xx streamed answer: the head goes out */
    REQ_EV_RETRY,         /* an attempt failed before the first byte, a retry is left */
    REQ_EV_RETRY_TIMER,   /* the backoff elapsed: route again */
    REQ_EV_COMPLETE,      /* the main leg's answer is complete */
    REQ_EV_PASS_THROUGH,  /* the engine judged the request itself (3xx/4xx): passed on */
    REQ_EV_GIVE_UP,       /* an attempt failed and no retry is left (or no route) */
    REQ_EV_REJECT,        /* the coordinator itself refuses: 400, 404, 503 */
    REQ_EV_FAIL,          /* a failure no retry can fix (answer over the limit) */
    REQ_EV_BROKEN,        /* the upstream failed after the head went out */
    REQ_EV_FIRST_TIMEOUT, /* first_token_timeout */
    REQ_EV_TOTAL_TIMEOUT, /* infer_timeout */
    REQ_EV_CLIENT_GONE,   /* the client's connection closed */
    REQ_EV_RESCHEDULE,    /* a streamed leg failed mid-answer: continue it on another instance */
    REQ_EV_TOKENIZE,      /* ROUTING: the prompt goes to an engine's /tokenize first */
    REQ_EV_TOKENIZED,     /* its answer (or its failure: then routed on load alone) */
};
#define REQ_EV_COUNT 20

const char *reqfsm_state_name(enum reqfsm_state s);  /* "ROUTING", ... ("?" if out of range) */
const char *reqfsm_event_name(enum reqfsm_event ev); /* "HANDOFF", ... */

/* The table: the new state for (from, ev), or -1 when the event is illegal there. */
int reqfsm_next(enum reqfsm_state from, enum reqfsm_event ev);

/* Per-worker counters of applied and ignored events, by (state, event). */
struct reqfsm_stats {
    _Atomic uint64_t cell[REQ_STATE_COUNT][REQ_EV_COUNT];
};

/* The machine of one request: its state and the trail of states it went through (for
 * logs: the last REQFSM_TRAIL). */
#define REQFSM_TRAIL 16 /* a power of two: the ring index is a mask */
struct reqfsm {
    uint8_t state;
    uint8_t trail[REQFSM_TRAIL]; /* ring of the states entered */
    uint16_t n_trail;            /* transitions applied (wraps; a multiple of the ring) */
};

void reqfsm_init(struct reqfsm *m); /* ROUTING */

/* Implementation details of reqfsm_step (inline: it runs several times per request on
 * the gateway's hot path). */
extern const int8_t reqfsm_table_[REQ_STATE_COUNT][REQ_EV_COUNT]; /* new state + 1 */
int reqfsm_ignored_(const struct reqfsm *m, enum reqfsm_event ev, const char *rid,
                    const char *cause);
void reqfsm_log_(int from, int to, enum reqfsm_event ev, const char *rid, const char *cause);

/* The one transition function: applies ev, counts the cell in st (NULL: not counted),
 * logs old state, new state, event and cause at debug level (rid names the request).
 * Returns the old state, or -1 when ev is illegal in the current state: then nothing
 * changes but the counter, and the event is logged at warn (a bug, not a client's
 * doing) and ignored. */
static inline int reqfsm_step(struct reqfsm *m, enum reqfsm_event ev, struct reqfsm_stats *st,
                              const char *rid, const char *cause)
{
    int from = m->state;
    if ((unsigned)ev >= REQ_EV_COUNT)
        return reqfsm_ignored_(m, ev, rid, cause);
    int to = reqfsm_table_[from][ev] - 1;
    if (st) {
        /* One writer per worker: a relaxed load and store, not a locked add. */
        _Atomic uint64_t *cell = &st->cell[from][ev];
        atomic_store_explicit(cell, atomic_load_explicit(cell, memory_order_relaxed) + 1,
                              memory_order_relaxed);
    }
    if (to < 0)
        return reqfsm_ignored_(m, ev, rid, cause);
    m->state = (uint8_t)to;
    m->trail[m->n_trail++ & (REQFSM_TRAIL - 1)] = (uint8_t)to;
    if (log_enabled(LOG_DEBUG))
        reqfsm_log_(from, to, ev, rid, cause);
    return from;
}

static inline enum reqfsm_state reqfsm_state(const struct reqfsm *m)
{
    return (enum reqfsm_state)m->state;
}

/* "ROUTING>DECODE>BACKOFF>..." into buf (truncated to cap). */
void reqfsm_trail(const struct reqfsm *m, char *buf, size_t cap);

/* Prometheus text for the sum of n workers' counters: applied events as
 * motor_coordinator_request_events_total{from,event,to}, illegal ones as
 * motor_coordinator_request_events_ignored_total{state,event}; cells never hit are
 * left out. */
void reqfsm_render(struct strbuf *sb, const struct reqfsm_stats *const *st, size_t n);

#endif
