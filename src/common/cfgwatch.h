/* cfgwatch — the configuration watch behind every daemon's hot reload (node manager,
 * controller, coordinator) and the worker pool's manifests directory.
 *
 * inotify watches each file's *directory*, never the file: editors and configuration
 * tools replace a file by writing a new one and renaming it over the old, and
 * Kubernetes updates a mounted ConfigMap or Secret by swapping a `..data` symlink; a
 * watch on the file itself would see neither. An event for one of the watched names (or
 * any `..`-prefixed name, the Kubernetes swap; or, for a watched directory, any name)
 * arms a debounce timer; when it expires the owner's callback runs once, however many
 * events the write produced. SIGHUP goes through the owner, which calls the same reload.
 *
 * Identity: the owner asks cfgwatch_changed() whether any watched file differs from what
 * it last loaded (cfgwatch_mark): the stat identity (device, inode, size, mtime) of each
 * file, symlinks followed, so a ConfigMap swap with identical content is still seen as
 * new (the inode changes) and a touch with the same content is a reload too. A missing
 * file has the identity "missing".
 *
 * When inotify is unavailable (limits reached) the failure is logged with the remedy
 * and the watch is simply absent: SIGHUP still reloads.
 *
 * Threading: everything on the thread of the reactor given to cfgwatch_new. */
#ifndef MOTOR_CFGWATCH_H
#define MOTOR_CFGWATCH_H

#include "common/reactor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cfgwatch;

/* Called on the reactor thread after the debounce. */
typedef void (*cfgwatch_fn)(void *arg);

#define CFGWATCH_DEBOUNCE_MS 100

/* A watch that calls fn(arg) after changes; what is watched comes with cfgwatch_set.
 * what names it in logs ("config", "manifests"). debounce_ms 0 = CFGWATCH_DEBOUNCE_MS.
 * fn NULL: identity only (cfgwatch_changed), no inotify watch at all. */
struct cfgwatch *cfgwatch_new(struct reactor *r, const char *what, int64_t debounce_ms,
                              cfgwatch_fn fn, void *arg);
/* Replace the watched set: files (NULL or "" entries are skipped; duplicates are fine)
 * and directories whose every entry counts (the manifests directory). Directories of
 * files are watched, one inotify watch per distinct directory. 0, or -errno when
 * inotify itself cannot be used (logged: config_watch_failed; the set is still
 * remembered for cfgwatch_changed). Logs config_watch per directory watched. */
int cfgwatch_set(struct cfgwatch *w, const char *const *files, size_t n_files,
                 const char *const *dirs, size_t n_dirs);
/* Whether a watched file's identity differs from the one recorded by cfgwatch_mark
 * (true before the first mark). Directories are not part of the identity: their owner
 * compares entries itself. */
bool cfgwatch_changed(const struct cfgwatch *w);
/* Record the current identity of the watched files as the one loaded. */
void cfgwatch_mark(struct cfgwatch *w);
/* Whether inotify watches are in place (false: SIGHUP only). */
bool cfgwatch_active(const struct cfgwatch *w);
/* The identity of one file as cfgwatch compares it (heap; "missing" when stat fails). */
char *cfgwatch_file_sig(const char *path);
/* Stop watching (a pending debounce is dropped) and free. NULL-safe. */
void cfgwatch_free(struct cfgwatch *w);

#endif
