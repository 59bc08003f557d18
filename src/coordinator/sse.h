/* sse — an incremental Server-Sent Events parser (WHATWG framing: LF, CRLF or CR line
 * ends, "field: value" lines, ':' comments, a blank line ends an event).
 *
 * Bytes are fed as they arrive from upstream, split anywhere. For every complete event
 * the callback gets the event's raw bytes (to forward unchanged) and its data field
 * (data lines joined by '\n'). Lines are capped (max_line) and so are events
 * (max_event): a peer cannot make us buffer without bound.
 * Not thread-safe; caller storage. */
#ifndef MOTOR_SSE_H
#define MOTOR_SSE_H

#include "common/strbuf.h"

#include <stdbool.h>
#include <stddef.h>

/* raw: the event's bytes including its terminating blank line. data: NUL-terminated.
 * has_data: at least one data line was present. Return 0 to go on, non-zero to stop
 * (sse_feed then returns that value). */
typedef int (*sse_event_cb)(const char *raw, size_t raw_len, const char *data, size_t data_len,
                            bool has_data, void *arg);

struct sse_parser {
    struct strbuf line; /* the current, incomplete line */
    struct strbuf raw;  /* raw bytes of the current event */
    struct strbuf data; /* data of the current event */
    bool has_data;
    bool cr_pending; /* last byte was CR: a following LF belongs to it */
    size_t events;   /* events dispatched so far */
};

void sse_init(struct sse_parser *p, size_t max_line, size_t max_event);
void sse_release(struct sse_parser *p);
/* 0, -E2BIG (a line or an event over its cap; the parser is then unusable), or the
 * callback's non-zero return. */
int sse_feed(struct sse_parser *p, const char *buf, size_t len, sse_event_cb cb, void *arg);
/* Raw bytes of an unfinished event (stream ended without a blank line), for a proxy
 * that forwards them as they are. Valid until the next feed/release. */
const char *sse_pending(const struct sse_parser *p, size_t *len);

#endif
