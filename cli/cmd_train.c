/* `longtune train`: LoRA/QLoRA fine-tuning with mlx-lm's `lora` flags (plus a JSON config whose
#define _POSIX_C_SOURCE 200809L
 * keys the flags override). Turns SIGINT/SIGTERM into a checkpoint and exit status 130/143.
 * Parsing only: the run itself is lt_train_run. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "train_guard.h"
#include "longtune/log.h"
#include "longtune/train.h"

static const char *usage = "longtune train --model M --data DIR [--config FILE.json] [--iters N] [--batch-size B] "
                           "[--max-seq-length T] [--learning-rate LR] [options]";

static void print_help(void) {
    printf(
        "usage: %s\n\n"
        "Fine-tunes LoRA adapters of M (a Hugging Face folder or a .gguf file; a quantized base stays\n"
        "quantized: QLoRA) on DIR/train.jsonl, evaluating on DIR/valid.jsonl. Writes the PEFT adapter\n"
        "(adapter_config.json, adapter_model.safetensors), a resumable checkpoint and metrics.jsonl\n"
        "into --adapter-path. Ctrl-C saves a checkpoint; resume with --resume-adapter-file.\n"
        "Exit status: 0 done, 1 failure, 2 usage, 3 memory ceiling, 4 diverged (a non-finite loss or\n"
        "gradient norm: the last good adapter is kept, diverged.json says where), 128+N signal N.\n\n"
        "options (defaults in brackets; flags override --config):\n"
        "  --model PATH               base model (required)\n"
        "  --data DIR                 train.jsonl [+ valid.jsonl] in mlx-lm formats (required)\n"
        "  --config FILE.json         options as a JSON object (keys as below, '-' or '_')\n"
        "  --adapter-path DIR         output folder [adapters]; one run at a time (locked)\n"
        "  --overwrite                a fresh run may replace the adapter already in it\n"
        "  --resume-adapter-file F    checkpoint to resume from (or the --adapter-path DIR holding it)\n"
        "  --iters N                  optimizer steps [1000]\n"
        "  --batch-size B             rows per micro-batch [4]\n"
        "  --grad-accum K             micro-batches per step [1]\n"
        "  --max-seq-length T         tokens per row [2048]\n"
        "  --seq-len-curriculum S     rows grow with progress, e.g. \"0:2048,0.3:8192,0.7:32768\" (fraction\n"
        "                             of iters : tokens); each stage starts a new pass over the data\n"
        "  --learning-rate LR         peak learning rate [1e-5]\n"
        "  --lr-schedule S            constant | cosine [constant]; --warmup N [0]; --min-lr LR [0]\n"
        "  --weight-decay W, --beta1, --beta2, --eps   AdamW [0, 0.9, 0.999, 1e-8]\n"
        "  --grad-clip G              clip the global gradient norm [off]\n"
        "  --num-layers K             LoRA on the last K layers [all]\n"
        "  --lora-rank R, --lora-alpha A, --lora-dropout P   [8, 16, 0]\n"
        "  --lora-targets LIST        q,k,v,o,gate,up,down [all seven]; on MoE models also\n"
        "                             experts.gate_up_proj, experts.down_proj (the experts)\n"
        "  --mask-prompt              train on completions/assistant turns only\n"
        "  --grad-checkpoint          recompute every layer in the backward (= --recompute all)\n"
        "  --recompute P              none | all | every:K | sliding[:K] | global[:K] | auto [none]:\n"
        "                             sliding/global recompute only the sliding-window / the\n"
        "                             full-attention layers (Gemma 2/3), the others keep their\n"
        "                             activations (K: layers per segment [1]); auto: the least\n"
        "                             recompute whose plan fits --memory-ceiling or the guard's ceiling\n"
        "  --recompute-attention      with a recompute policy, rerun attention in the backward\n"
        "                             instead of keeping its output (less memory, slower)\n"
        "  --recompute-attention-layers N  rerun it in N of the recomputed layers only (sliding-\n"
        "                             window ones first; the memory and time in between) [0]\n"
        "  --offload-checkpoints      keep the checkpoints in pinned host memory (needs a\n"
        "                             recompute policy; cuda: copies overlap the layers)\n"
        "  --moe-chunk-tokens N       MoE models: tokens whose experts run together, rerun in the\n"
        "                             backward (bounds the experts' memory) [4096]\n"
        "  --chunk-rows N             rows per chunk of the norms, projections and MLP: smaller\n"
        "                             chunks hold less and launch more [8192; auto may halve it]\n"
        "  --bf16-products            products of bf16, f16 and quantized weights (and the loss's, on\n"
        "                             such a head) on x and W rounded to bf16, and flash attention's\n"
        "                             tiles on bf16 operands, f32 sums, as on cuda; the cpu runs them\n"
        "                             through oneDNN and on AMX or AVX512-BF16 where the CPU has them:\n"
        "                             up to several times the f32 rate\n"
        "  --attention flash|naive    [flash]; --loss fused|chunked|naive [fused]\n"
        "  --no-pack                  one example per row; --pack-algorithm first-fit|bfd\n"
        "  --quantize FMT             quantize a dense base at load: int4_g64, q4_0, q4_1, q8_0,\n"
        "                             q4_k, q5_k, q6_k\n"
        "  --base-dtype file|fp8      fp8: hold every projection in FP8 E4M3 with a scale per row\n"
        "                             (from any dtype the model has) and run its products as FP8\n"
        "                             GEMMs on activations scaled per row: faster on Hopper, about\n"
        "                             as large as bf16 [file: as the file holds it]\n"
        "  --fp8-skip LIST            with --base-dtype fp8: projections held as the file holds them\n"
        "                             (q,k,v,o,gate,up,down): less rounding, less speed\n"
        "  --rope-scaling TYPE        extend the context: linear | dynamic | yarn | llama3 | longrope\n"
        "                             (transformers' semantics; replaces the model's own scaling) with\n"
        "  --rope-factor F            the scaling factor (required with --rope-scaling);\n"
        "                             --original-max-position N [the model's max_position_embeddings],\n"
        "                             --yarn-beta-fast X --yarn-beta-slow Y [32, 1], --rope-attn-factor A\n"
        "                             [the type's default]\n"
        "  --chat-template NAME|FILE  chat format for chat records: chatml, llama3, qwen2.5, ... or a\n"
        "                             Jinja template file [the tokenizer's own template]\n"
        "  --device cpu|cuda          where the model, adapters and optimizer live [cpu]\n"
        "  --cuda-graph on|off        CUDA: replay the whole step from a CUDA graph while the batch\n"
        "                             shape holds (bit-identical to eager steps) [on]\n"
        "  --save-every N [100], --steps-per-eval N [200], --steps-per-report N [10],\n"
        "  --val-batches N [25, -1 = all], --seed S [0], --threads N [all]\n"
        "  --test                     after training, evaluate DIR/test.jsonl (Test loss, Test ppl);\n"
        "                             --test-batches N [500, -1 = all]\n"
        "  --distributed auto|off|nccl  auto: under `mpirun -np K` train data parallel over the K ranks\n"
        "                             (each takes its share of every batch's rows; rank 0 writes) [auto]\n"
        "  --context-parallel         several ranks: split every row over them instead (Ulysses all-to-all\n"
        "                             over heads when K divides the key/value heads, else ring attention on\n"
        "                             the host; needs --batch-size 1 --no-pack, --max-seq-length a multiple of 2K)\n" LT_CLI_GUARD_HELP,
        usage);
}

/* First signal: finish the step, save, exit. A second one, or any while the tokenizer, data and
 * model load (nothing to save yet): stop at once (default action). */
static void on_signal(int sig) {
    if (lt_train_stop_requested() || !lt_train_stop_saves()) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    lt_train_request_stop(sig);
}

int lt_cmd_train(int argc, char **argv) {
    lt_train_options opt;
    memset(&opt, 0, sizeof opt);
    lt_cli_guard guard;
    memset(&guard, 0, sizeof guard);
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return LT_EXIT_FAIL;
    int rc = LT_EXIT_OK;
    lt_comm *comm = NULL;
    FILE *quiet = NULL;
    /* --help first, then the config file, then every other flag over it. */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_help();
            goto done;
        }
    for (int i = 1; i < argc; i++) {
        const char *cfg = NULL;
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) {
                rc = lt_cli_usage_error("train", usage, "--config needs a file");
                goto done;
            }
            cfg = argv[i + 1];
        } else if (!strncmp(argv[i], "--config=", 9)) {
            cfg = argv[i] + 9;
        }
        if (cfg) {
            lt_status s = lt_train_options_load_json(ctx, &opt, cfg);
            if (s != LT_OK) {
                rc = lt_cli_fail("train", ctx, s);
                goto done;
            }
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) || !a[2]) {
            rc = lt_cli_usage_error("train", usage, "unexpected argument '%s'", a);
            goto done;
        }
        char key[64];
        const char *eq = strchr(a, '='), *value = NULL;
        size_t kl = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (kl >= sizeof key) {
            rc = lt_cli_usage_error("train", usage, "unknown option '%s'", a);
            goto done;
        }
        memcpy(key, a + 2, kl);
        key[kl] = '\0';
        if (!strcmp(key, "config")) {
            i += !eq;
            continue;
        }
        if (!strcmp(key, "train")) continue; /* mlx-lm's mode flag: training is what this command does */
        int used = 0,
            gf = lt_cli_guard_flag(&guard, usage, key, eq ? eq + 1 : (i + 1 < argc ? argv[i + 1] : NULL), &used);
        if (gf < 0) {
            rc = LT_EXIT_USAGE;
            goto done;
        }
        if (gf) {
            i += used && !eq;
            continue;
        }
        lt_train_option_kind kind = lt_train_option_kind_of(key);
        if (kind == LT_TRAIN_OPTION_UNKNOWN) {
            rc = lt_cli_usage_error("train", usage, "unknown option '%s'", a);
            goto done;
        }
        if (eq) value = eq + 1;
        else if (kind == LT_TRAIN_OPTION_BOOL) value = "true";
        else if (i + 1 < argc) value = argv[++i];
        else {
            rc = lt_cli_usage_error("train", usage, "option '%s' needs a value", a);
            goto done;
        }
        lt_status s = lt_train_options_set(ctx, &opt, key, value);
        if (s != LT_OK) {
            rc = lt_cli_usage_error("train", usage, "%s", lt_ctx_error(ctx));
            goto done;
        }
    }
    /* The guard's keys from a --config file; a flag given on the command line wins. */
    if (opt.memory_ceiling[0] && !guard.ceiling &&
        (lt_cli_parse_bytes(opt.memory_ceiling, &guard.ceiling) || !guard.ceiling)) {
        rc = lt_cli_usage_error("train", usage, "option 'memory_ceiling' '%s': expected a byte size (\"12G\")",
                                opt.memory_ceiling);
        goto done;
    }
    guard.allow_low |= opt.allow_low_memory;
    guard.off |= opt.no_memory_guard;
    lt_train_options resolved;
    lt_status s = lt_train_options_resolve(ctx, &opt, &resolved);
    if (s != LT_OK) {
        rc = lt_cli_usage_error("train", usage, "%s", lt_ctx_error(ctx));
        goto done;
    }
    /* A device this build or machine lacks is refused before the guard measures it. */
    if ((s = lt_model_device_available(ctx, resolved.device)) != LT_OK) {
        rc = lt_cli_fail("train", ctx, s);
        goto done;
    }
    /* The world an MPI launcher started; a plain run (or --distributed off) never touches MPI. */
    int env_rank = 0, env_size = 1, launched = lt_comm_env_world(&env_rank, &env_size, NULL) && env_size > 1;
    int nccl = !strcmp(resolved.distributed, "nccl");
    if ((!strcmp(resolved.distributed, "auto") && launched) || nccl) {
        /* Gradients are reduced where the model keeps them: MPI for host models, NCCL for CUDA. */
        lt_comm_options co = {.backend = nccl || resolved.device == LT_DEVICE_CUDA ? LT_COMM_NCCL : LT_COMM_MPI};
        if ((s = lt_comm_init(ctx, &co, &comm)) != LT_OK) {
            rc = lt_cli_fail("train", ctx, s);
            goto done;
        }
        if (lt_comm_rank(comm) != 0) {
            /* One voice: the other ranks report warnings and errors only. */
            lt_log_set_level(LT_LOG_WARN);
            quiet = fopen("/dev/null", "w");
        }
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if ((rc = lt_cli_recompute_auto(ctx, &guard, &resolved, lt_comm_size(comm))) != 0) goto done;
    if ((rc = lt_cli_guard_start(ctx, &guard, &resolved, lt_comm_size(comm))) != 0) goto done;
    lt_train_result res;
    memset(&res, 0, sizeof res);
    res.comm = comm;
    s = lt_train_run(ctx, &resolved, quiet ? quiet : stderr, &res);
    if ((rc = lt_cli_guard_finish(ctx, &guard, &resolved, &res, s)) != 0) goto done;
    if (s == LT_ERR_INTERRUPTED) {
        int sig = lt_train_stop_requested();
        fprintf(stderr, "longtune train: %s\n", lt_ctx_error(ctx));
        rc = 128 + (sig > 0 ? sig : SIGINT);
        goto done;
    }
    if (s == LT_ERR_DIVERGED) {
        fprintf(stderr, "longtune train: %s: %s\n", lt_status_str(s), lt_ctx_error(ctx));
        rc = LT_EXIT_DIVERGED;
        goto done;
    }
    if (s != LT_OK) {
        rc = lt_cli_fail("train", ctx, s);
        goto done;
    }
    char b1[32], b2[32], b3[32], host[64] = "";
    if (resolved.device != LT_DEVICE_CPU)
        snprintf(host, sizeof host, "; host peak %s", lt_cli_fmt_bytes(res.host_peak_bytes, b3, 32));
    if (lt_comm_rank(comm) == 0)
        printf("trained %lld steps (%lld tokens) in %.1f s; val loss %.4f -> %.4f; %s peak %s (plan %s)%s\n"
               "adapter: %s/adapter_model.safetensors\n",
               (long long)(res.steps - res.start_step), (long long)(res.tokens - res.start_tokens), res.elapsed_s,
               res.first_val_loss, res.last_val_loss, resolved.device == LT_DEVICE_CPU ? "host" : "device",
               lt_cli_fmt_bytes(res.peak_bytes, b1, 32), lt_cli_fmt_bytes(res.plan_bytes, b2, 32), host,
               resolved.adapter_path);
done:
    if (guard.g) lt_guard_stop(guard.g);
    if (quiet) fclose(quiet);
    /* A rank that fails alone would leave the others waiting in a collective: end the job. A stop
     * (exit 128 + signal) is taken by every rank after the same step and needs no abort. */
    if (rc != LT_EXIT_OK && rc < 128 && lt_comm_size(comm) > 1) {
        fflush(NULL);
        lt_comm_abort(comm, rc);
    }
    lt_comm_free(ctx, comm);
    lt_ctx_free(ctx);
    return rc;
}
