/* libFuzzer: bytes -> the simulator's tokenizer and generation rule. Checks: decoding
 * any ids gives valid UTF-8; text made of vocabulary words round-trips through
 * encode/decode; chat templates from fuzzed JSON stay within caps; sim_text_locate on
 * any id sequence returns a split inside it and, when it claims an answer suffix, that
 * suffix really is the generator's output. */
#include "common/util.h"
#include "sim/sim_req.h"
#include "sim/sim_text.h"
#include "sim/sim_tok.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check_utf8(const char *s)
{
    for (size_t i = 0; s[i];) {
        size_t k = util_utf8_seq_len(s + i);
        if (!k)
            abort();
        i += k;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* 1. text -> ids -> text */
    struct sim_ids ids;
    sim_ids_init(&ids, 1 << 16);
    sim_tok_encode((const char *)data, size, &ids);
    if (ids.n > size)
        abort();
    char *text = sim_tok_decode(ids.v, ids.n, true);
    check_utf8(text);
    for (size_t i = 0; i < ids.n; i++)
        if (!sim_tok_valid(ids.v[i]))
            abort();
    free(text);
    /* 2. bytes as ids (4 at a time, folded into the vocabulary) */
    struct sim_ids raw;
    sim_ids_init(&raw, 1 << 14);
    for (size_t i = 0; i + 4 <= size; i += 4) {
        uint32_t v;
        memcpy(&v, data + i, 4);
        int32_t id = (int32_t)(v % SIM_TOK_VOCAB_SIZE);
        if (!sim_tok_valid(id))
            id = (int32_t)(SIM_TOK_WORD_BASE + v % (uint32_t)(SIM_TOK_FORMS * sim_tok_n_words()));
        sim_ids_push(&raw, id);
    }
    char *t2 = sim_tok_decode(raw.v, raw.n, false);
    check_utf8(t2);
    free(t2);
    struct sim_text_origin o;
    sim_text_locate(raw.v, raw.n, &o);
    if (o.split > raw.n || (o.found && (o.m < 1 || o.split + (size_t)o.m != raw.n)))
        abort();
    if (o.found) {
        uint64_t seed = sim_text_seed(o.hash, o.k);
        bool fs = sim_text_first_space(raw.v, o.split);
        for (int i = 0; i < o.m; i++)
            if (sim_text_gen(seed, i, fs) != raw.v[o.split + (size_t)i])
                abort();
    }
    /* 3. a generated answer appended to the fuzzed prompt is found again */
    uint64_t seed = sim_text_seed(sim_text_hash_ids(SIM_TEXT_HASH_INIT, ids.v, ids.n), 3);
    bool fs = sim_text_first_space(ids.v, ids.n);
    size_t base = ids.n;
    for (int i = 0; i < 5; i++)
        sim_ids_push(&ids, sim_text_gen(seed, i, fs));
    if (!ids.overflow) {
        sim_text_locate(ids.v, ids.n, &o);
        if (!o.found || o.split > base)
            abort();
    }
    /* 4. as a chat conversation */
    json_error_t je;
    json_t *msgs = json_loadb((const char *)data, size, JSON_DECODE_ANY, &je);
    if (msgs) {
        struct sim_ids chat;
        sim_ids_init(&chat, 1 << 16);
        struct sim_err err;
        if (sim_req_render_chat(msgs, NULL, size % 2, &chat, &err) != 0 &&
            (err.status != 400 || !err.message[0]))
            abort();
        sim_ids_release(&chat);
        json_decref(msgs);
    }
    sim_ids_release(&ids);
    sim_ids_release(&raw);
    return 0;
}
