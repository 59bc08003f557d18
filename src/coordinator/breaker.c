#include "coordinator/breaker.h"

#include <string.h>

void brk_init(struct brk *b, const struct brk_params *p)
{
    memset(b, 0, sizeof(*b));
    b->p = *p;
    if (b->p.threshold < 1)
        b->p.threshold = 1;
    if (b->p.max_open_ms < b->p.open_ms)
        b->p.max_open_ms = b->p.open_ms;
    b->cur_open_ms = b->p.open_ms;
}

void brk_set_params(struct brk *b, const struct brk_params *p)
{
    b->p = *p;
    if (b->p.threshold < 1)
        b->p.threshold = 1;
    if (b->p.max_open_ms < b->p.open_ms)
        b->p.max_open_ms = b->p.open_ms;
    /* Closed: the next trip starts from the new base. Open: the period running now ends
     * when it was going to; the next one follows the new bounds. */
    if (b->state == BRK_CLOSED)
        b->cur_open_ms = b->p.open_ms;
    else if (b->cur_open_ms < b->p.open_ms)
        b->cur_open_ms = b->p.open_ms;
    else if (b->cur_open_ms > b->p.max_open_ms)
        b->cur_open_ms = b->p.max_open_ms;
}

enum brk_state brk_state_at(const struct brk *b, int64_t now_ms)
{
    if (b->state == BRK_OPEN && now_ms >= b->open_until)
        return BRK_HALF_OPEN;
    return b->state;
}

bool brk_peek(const struct brk *b, int64_t now_ms)
{
    switch (brk_state_at(b, now_ms)) {
    case BRK_CLOSED:
        return true;
    case BRK_HALF_OPEN:
        return !b->trial_out;
    case BRK_OPEN:
        break;
    }
    return false;
}

bool brk_acquire(struct brk *b, int64_t now_ms, bool *trial)
{
    *trial = false;
    if (b->state == BRK_OPEN && now_ms >= b->open_until) {
        b->state = BRK_HALF_OPEN;
        b->trial_out = false;
    }
    switch (b->state) {
    case BRK_CLOSED:
        return true;
    case BRK_HALF_OPEN:
        if (b->trial_out)
            return false;
        b->trial_out = true;
        *trial = true;
        return true;
    case BRK_OPEN:
        break;
    }
    return false;
}

static void trip(struct brk *b, int64_t now_ms)
{
    b->state = BRK_OPEN;
    b->trip_count++;
    b->open_until = now_ms + b->cur_open_ms;
    b->failures = 0;
    b->trial_out = false;
}

void brk_success(struct brk *b, bool trial)
{
    if (b->state == BRK_CLOSED) {
        b->failures = 0;
        return;
    }
    if (trial && b->state == BRK_HALF_OPEN) {
        b->state = BRK_CLOSED;
        b->failures = 0;
        b->trial_out = false;
        b->cur_open_ms = b->p.open_ms;
    }
}

bool brk_failure(struct brk *b, int64_t now_ms, bool trial)
{
    if (b->state == BRK_CLOSED) {
        if (++b->failures >= b->p.threshold) {
            trip(b, now_ms);
            return true;
        }
        return false;
    }
    if (trial && b->state == BRK_HALF_OPEN) {
        int64_t next = b->cur_open_ms * 2;
        b->cur_open_ms = next > b->p.max_open_ms ? b->p.max_open_ms : next;
        trip(b, now_ms);
        return true;
    }
    return false;
}

void brk_abandon(struct brk *b, bool trial)
{
    if (trial && b->state == BRK_HALF_OPEN)
        b->trial_out = false;
}

const char *brk_state_name(enum brk_state s)
{
    switch (s) {
    case BRK_CLOSED:
        return "closed";
    case BRK_OPEN:
        return "open";
    case BRK_HALF_OPEN:
        return "half_open";
    }
    return "unknown";
}
