/* `longtune train` as a library call: opens the tokenizer, tokenises the dataset folder (train and
 * valid splits), loads the model with the run's LoRA choice, then hands over to lt_train_fit. It
 * owns nothing past its return. */
#include <math.h>
#include <string.h>

#include "longtune/dataset.h"
#include "longtune/log.h"
#include "train/train_internal.h"

static void log_split(const char *name, const lt_dataset *ds) {
    lt_dataset_stats s = lt_dataset_get_stats(ds);
    LT_INFO("%s: %lld records, %lld tokens (%lld supervised), %lld..%lld tokens per record%s%s", name,
            (long long)s.records, (long long)s.tokens, (long long)s.supervised, (long long)s.min_len,
            (long long)s.max_len, s.chat_format != LT_CHAT_NONE ? ", chat template " : "",
            s.chat_format != LT_CHAT_NONE ? lt_chat_format_name(s.chat_format) : "");
}

lt_status lt_train_run(lt_ctx *ctx, const lt_train_options *opt, FILE *progress, lt_train_result *res) {
    lt_tokenizer *tok = NULL;
    lt_dataset *train = NULL, *valid = NULL;
    lt_model *m = NULL;
    lt_status s;
    if (opt->quantize[0] && strcmp(opt->quantize, "int4_g64"))
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "--quantize %s: the loader quantizes to int4_g64 only", opt->quantize);
    if (opt->threads > 0) lt_ctx_set_threads(ctx, opt->threads);
    LT_TRY(lt_model_device_available(ctx, opt->device)); /* before tokenising a whole data set */
    if ((s = lt_tokenizer_load(ctx, opt->model, &tok)) != LT_OK) goto done;
    lt_dataset_options dopt;
    memset(&dopt, 0, sizeof dopt);
    dopt.mask_prompt = opt->mask_prompt;
    if ((s = lt_dataset_load_split(ctx, opt->data, "train", tok, &dopt, &train)) != LT_OK) goto done;
    log_split("train", train);
    s = lt_dataset_load_split(ctx, opt->data, "valid", tok, &dopt, &valid);
    if (s == LT_ERR_NOT_FOUND) {
        LT_WARN("%s has no valid.jsonl: no validation loss", opt->data);
        lt_ctx_clear_error(ctx);
        valid = NULL;
    } else if (s != LT_OK) {
        goto done;
    } else {
        log_split("valid", valid);
    }
    lt_lora_options lora;
    if ((s = lt_train_lora_options(ctx, opt, &lora)) != LT_OK) goto done;
    lt_model_options mo = {opt->device, opt->quantize[0] != 0};
    if ((s = lt_model_load(ctx, opt->model, &mo, &lora, &m)) != LT_OK) goto done;
    const lt_model_config *cfg = lt_model_get_config(m);
    lt_model_sizes sz = lt_model_get_sizes(m);
    LT_INFO("model: %lld layers, width %lld, vocab %lld, projections %s; LoRA r=%lld on %lld layers: %lld parameters",
            (long long)cfg->L, (long long)cfg->C, (long long)cfg->V, lt_dtype_name(cfg->proj_dtype[LT_PROJ_Q]),
            (long long)opt->lora_rank, (long long)(opt->num_layers > 0 && opt->num_layers < cfg->L ? opt->num_layers : cfg->L),
            (long long)sz.n_lora_params);
    lt_pack_input tin = lt_dataset_input(train), vin;
    if (valid) vin = lt_dataset_input(valid);
    s = lt_train_fit(ctx, opt, m, &tin, valid ? &vin : NULL, progress, res);
done:
    if (m) lt_model_free(ctx, m);
    if (valid) lt_dataset_free(ctx, valid);
    if (train) lt_dataset_free(ctx, train);
    if (tok) lt_tokenizer_free(tok);
    return s;
}
