/* Shared by generate, chat and eval: model opening with the adapter check, EOS ids, and the
 * per-row text stream. */
#include "gen_common.h"

#include <stdlib.h>
#include <string.h>

#include "longtune/train.h"

lt_status lt_gen_open(lt_ctx *ctx, const char *path, const char *adapter_dir, lt_device dev, lt_tokenizer **tok,
                      lt_model **m) {
    *tok = NULL, *m = NULL;
    LT_TRY(lt_tokenizer_load(ctx, path, tok));
    lt_model_options mo = {.device = dev};
    lt_lora_options lora;
    memset(&lora, 0, sizeof lora);
    if (adapter_dir) {
        lt_model_config cfg;
        LT_TRY(lt_model_inspect(ctx, path, &mo, &cfg));
        LT_TRY(lt_peft_read_config(ctx, adapter_dir, cfg.L, &lora));
    } else {
        /* The model always carries LoRA; rank 1 on one projection of the last layer, with B = 0,
           leaves the base's outputs unchanged at the least cost. */
        lora.targets = 1u << LT_PROJ_Q;
        lora.num_layers = 1;
        lora.rank = 1;
    }
    LT_TRY(lt_model_load(ctx, path, &mo, &lora, m));
    if (adapter_dir) LT_TRY(lt_peft_load(ctx, adapter_dir, *m)); /* refuses a non-finite value */
    return LT_OK;
}

int lt_gen_stop_ids(const lt_tokenizer *tok, const lt_model *m, int32_t *ids, int cap) {
    const lt_model_config *cf = lt_model_get_config(m);
    int n = 0;
#define ADD(id)                                                       \
    do {                                                              \
        int32_t v_ = (id), dup_ = 0;                                  \
        for (int k_ = 0; k_ < n; k_++) dup_ |= ids[k_] == v_;         \
        if (v_ >= 0 && v_ < cf->V && !dup_ && n < cap) ids[n++] = v_; \
    } while (0)
    for (int i = 0; i < cf->n_eos && i < LT_MAX_EOS; i++) ADD(cf->eos_ids[i]);
    if (cf->n_eos == 0) ADD(cf->eos_id);
    ADD(lt_tokenizer_eos(tok));
    const char *ends[] = {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>"};
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) ADD(lt_tokenizer_token_id(tok, ends[i]));
#undef ADD
    return n;
}

/* Bytes at the end of t[0..len) that may still change: a trailing U+FFFD run (an incomplete UTF-8
 * sequence decodes to it until its last byte comes), and the longest suffix that begins a stop
 * string. */
static size_t held_back(const lt_gen_stream *s) {
    size_t hold = 0, len = s->len;
    while (hold + 3 <= len && hold < 9 && !memcmp(s->text + len - hold - 3, "\xEF\xBF\xBD", 3)) hold += 3;
    for (int i = 0; i < s->n_stops; i++) {
        size_t sl = strlen(s->stops[i]);
        for (size_t k = sl > 1 ? sl - 1 : 0; k > 0; k--)
            if (k <= len && !memcmp(s->text + len - k, s->stops[i], k)) {
                if (k > hold) hold = k;
                break;
            }
    }
    return hold;
}

int lt_gen_stream_push(lt_gen_stream *s, int32_t id) {
    if (s->stopped) return 1;
    for (int i = 0; i < s->n_stop_ids; i++)
        if (id == s->stop_ids[i]) return 0; /* an end id ends the row without text */
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        int32_t *p = realloc(s->ids, cap * sizeof(int32_t));
        if (!p) return 1;
        s->ids = p, s->cap = cap;
    }
    s->ids[s->n++] = id;
    char *text = NULL;
    size_t len = 0;
    if (lt_tokenizer_decode(s->ctx, s->tok, s->ids, s->n, 1, &text, &len) != LT_OK) return 0;
    free(s->text);
    s->text = text, s->len = len;
    /* a stop string anywhere in the text not yet printed (or straddling it) ends the row there */
    for (int i = 0; i < s->n_stops; i++) {
        size_t sl = strlen(s->stops[i]), from = s->printed > sl ? s->printed - sl : 0;
        char *hit = sl ? strstr(s->text + from, s->stops[i]) : NULL;
        if (hit && (size_t)(hit - s->text) >= s->printed) {
            s->len = (size_t)(hit - s->text);
            s->text[s->len] = 0;
            s->stopped = 1;
        }
    }
    size_t upto = s->stopped ? s->len : s->len - held_back(s);
    if (s->out && upto > s->printed) {
        fwrite(s->text + s->printed, 1, upto - s->printed, s->out);
        fflush(s->out);
    }
    if (upto > s->printed) s->printed = upto;
    return s->stopped;
}

void lt_gen_stream_finish(lt_gen_stream *s) {
    if (s->out && s->len > s->printed) {
        fwrite(s->text + s->printed, 1, s->len - s->printed, s->out);
        fflush(s->out);
    }
    s->printed = s->len;
}

void lt_gen_stream_free(lt_gen_stream *s) {
    free(s->ids);
    free(s->text);
    s->ids = NULL, s->text = NULL;
}
