/* logfile — an append-only text file rotated by size: path, path.1 ... path.keep.
 *
 * Used to persist a child's output. Each file stays <= max_bytes: a write that does not
 * fit is split at the last newline that fits, the file is rotated (path.(keep-1) ->
 * path.keep, ..., path -> path.1; the oldest is dropped) and the rest goes to a fresh
 * path. A single line longer than max_bytes is split across files. keep == 0 keeps no
 * history: rotation just truncates path.
 *
 * Regular-file writes do not block on a peer, so this is called from the reactor thread
 * directly. A failed write (ENOSPC, EIO) drops that data and is counted; later writes
 * are tried again.
 *
 * Heap object (new/free). Not thread-safe: one owner thread. */
#ifndef MOTOR_LOGFILE_H
#define MOTOR_LOGFILE_H

#include <stddef.h>
#include <stdint.h>

struct logfile;

/* Open (create, mode 0644, or append to) path. max_bytes > 0; keep <= 100.
 * Returns 0 and *out, or -EINVAL / -errno of open(2). The path is copied. */
int logfile_open(const char *path, size_t max_bytes, unsigned keep, struct logfile **out);
/* Close the file. NULL-safe. */
void logfile_close(struct logfile *lf);

/* Append n bytes, rotating as described above. 0, or the -errno of the first failing
 * write/rename/open (the data that could not be written is dropped). */
int logfile_write(struct logfile *lf, const void *data, size_t n);
/* Rotate now (even when the current file is empty). 0 or -errno. */
int logfile_rotate(struct logfile *lf);

/* Size of the current file as this writer knows it. */
size_t logfile_size(const struct logfile *lf);
/* Bytes dropped because a write failed. */
uint64_t logfile_dropped(const struct logfile *lf);

#endif
