/* libFuzzer: bytes -> KVEventBatch payloads applied to a small KV index (kvidx), as an
 * engine — or anything that connects as one — would send them. The input is cut into
 * batches at 0xfe 0xfe markers; each goes to one of three slots. Checks the index's
 * promises whatever arrives: no read past a buffer (ASan), never more entries than
 * max_blocks, the slots' entries add up to the total, a prefix match never exceeds the
 * query, and clearing a slot empties it. */
#include "coordinator/kvidx.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAXB 48

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvidx *x = kvidx_new(MAXB);
    const char *names[] = {"a:1", "b:1", "c:1"};
    int slots[3];
    for (int i = 0; i < 3; i++)
        slots[i] = kvidx_slot_get(x, names[i]);
    struct kvidx_stats st = {0};
    size_t start = 0, k = 0;
    for (size_t i = 0; i <= size; i++) {
        if (i < size && !(i + 1 < size && data[i] == 0xfe && data[i + 1] == 0xfe))
            continue;
        int rank;
        (void)kvidx_apply(x, slots[k++ % 3], data + start, i - start, &st, &rank);
        if (rank < -1 || rank > 65535)
            abort();
        start = i + 2;
        i++;
    }
    struct kvidx_info in;
    kvidx_info(x, &in);
    size_t sum = 0;
    for (int i = 0; i < 3; i++)
        sum += kvidx_slot_entries(x, slots[i]);
    if (in.entries > MAXB || sum != in.entries)
        abort();
    /* Query with the input read as token ids, for every block size the slots learned. */
    uint32_t toks[512];
    size_t nt = size / 4 < 512 ? size / 4 : 512;
    memcpy(toks, data, nt * 4);
    uint64_t keys[512];
    for (int i = 0; i < 3; i++) {
        int bs = kvidx_block_size(x, names[i]);
        if (!bs)
            continue;
        size_t nk = kvidx_keys(toks, nt, bs, keys, 512);
        uint32_t got[3];
        kvidx_match(x, keys, nk, bs, names, 3, got);
        for (int j = 0; j < 3; j++)
            if (got[j] > nk)
                abort();
    }
    kvidx_slot_clear(x, slots[0]);
    if (kvidx_slot_entries(x, slots[0]) != 0)
        abort();
    kvidx_free(x);
    return 0;
}
