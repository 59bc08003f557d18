/* list — an intrusive, circular, doubly-linked list (libuv's queue.h, Linux's list.h).
 *
 * A list is a `struct list_head` sentinel; an element embeds a `struct list_head` and is
 * found from it with list_entry(). Every operation is O(1) and allocates nothing.
 * A node that is not on a list is self-linked (list_init or list_remove leave it so), so
 * list_linked() tells whether it is on one and removing it twice is harmless — the
 * "was it already unlinked?" bookkeeping every hand-written unlink needed is gone.
 *
 * Removing the current element while walking is allowed with list_for_each_safe only.
 * Not thread-safe: a list belongs to one thread (or one lock). */
#ifndef MOTOR_LIST_H
#define MOTOR_LIST_H

#include <stdbool.h>
#include <stddef.h>

struct list_head {
    struct list_head *next, *prev;
};

/* Static initializer of a sentinel or node: struct list_head l = LIST_INIT(l); */
#define LIST_INIT(name) {&(name), &(name)}

/* The element that embeds node `ptr` as its member `member`. */
#define list_entry(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

static inline void list_init(struct list_head *h)
{
    h->next = h;
    h->prev = h;
}

/* True when the list h (a sentinel) has no element. */
static inline bool list_empty(const struct list_head *h)
{
    return h->next == h;
}

/* True when node n is on some list (false for a node list_init'ed or removed). A zeroed
 * node (never initialized) counts as not linked too. */
static inline bool list_linked(const struct list_head *n)
{
    return n->next != NULL && n->next != n;
}

static inline void list_insert_between(struct list_head *n, struct list_head *prev,
                                       struct list_head *next)
{
    n->prev = prev;
    n->next = next;
    prev->next = n;
    next->prev = n;
}

/* Append n (not on any list) at the tail of h. */
static inline void list_insert_tail(struct list_head *h, struct list_head *n)
{
    list_insert_between(n, h->prev, h);
}

/* Insert n (not on any list) at the head of h. */
static inline void list_insert_head(struct list_head *h, struct list_head *n)
{
    list_insert_between(n, h, h->next);
}

/* Unlink n from its list and leave it self-linked; a no-op for a node not on a list
 * (self-linked or zeroed). */
static inline void list_remove(struct list_head *n)
{
    if (!list_linked(n)) {
        list_init(n);
        return;
    }
    n->prev->next = n->next;
    n->next->prev = n->prev;
    list_init(n);
}

/* First / last node of h, NULL when empty. */
static inline struct list_head *list_first(const struct list_head *h)
{
    return list_empty(h) ? NULL : h->next;
}
static inline struct list_head *list_last(const struct list_head *h)
{
    return list_empty(h) ? NULL : h->prev;
}

/* Move every element of from to the tail of to (from ends empty). */
static inline void list_splice_tail(struct list_head *to, struct list_head *from)
{
    if (list_empty(from))
        return;
    struct list_head *first = from->next, *last = from->prev;
    first->prev = to->prev;
    to->prev->next = first;
    last->next = to;
    to->prev = last;
    list_init(from);
}

/* Number of elements (O(n): for tests, logs and metrics). */
static inline size_t list_count(const struct list_head *h)
{
    size_t n = 0;
    for (const struct list_head *p = h->next; p != h; p = p->next)
        n++;
    return n;
}

/* Walk nodes of h; `pos` is a struct list_head *. The body must not remove pos. */
#define list_for_each(pos, h) for ((pos) = (h)->next; (pos) != (h); (pos) = (pos)->next)
/* Walk nodes of h; the body may remove (and free) pos. tmp is a struct list_head *. */
#define list_for_each_safe(pos, tmp, h)                                                       \
    for ((pos) = (h)->next, (tmp) = (pos)->next; (pos) != (h); (pos) = (tmp), (tmp) = (pos)->next)

#endif
