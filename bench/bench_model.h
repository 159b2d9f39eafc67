/* Benchmark model shapes (the published configs of Qwen3-8B and SmolLM2-135M, Qwen3-30B-A3B's with
 * four layers, plus tiny shapes for tests) and random-weight checkpoints of those shapes, written once as a Hugging Face folder
 * (config.json + model.safetensors) by streaming each tensor in bounded chunks, so an 8B model never
 * sits whole in this process's memory, and reused by later runs. It loads through the public
 * lt_model_load; it does not build models any other way. */
#ifndef LT_BENCH_MODEL_H
#define LT_BENCH_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "longtune/model.h"

typedef struct lt_bench_shape {
    const char *name;  /* "qwen3-8b", "smollm2-135m", "tiny" */
    const char *title; /* for result files, e.g. "Qwen3-8B (L=36 C=4096 ...)" */
    lt_model_arch arch;
    int64_t V, C, F, L, H, Hkv, D;
    double rope_theta;
    double rms_eps;
    int tied;
    int64_t max_positions;
    /* Mixture of experts (E = 0: dense). Every layer routes each token to its K largest of E
     * SwiGLU experts of width moe_F (F is then the config's unused dense intermediate_size), the
     * top-K weights renormalised when norm_topk; aux_coef > 0 adds the router's load-balancing
     * loss (output_router_logits true). The checkpoint holds the experts per expert, as
     * transformers' save_pretrained and the published files do:
     * model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight and the router model.layers.N.mlp.gate.weight. */
    int64_t E, K, moe_F;
    int norm_topk;
    double aux_coef;
} lt_bench_shape;

/* The shape called `name`, or NULL. */
const lt_bench_shape *lt_bench_shape_find(const char *name);
/* "qwen3-8b|smollm2-135m|tiny" (the dense shapes) for usage lines. */
const char *lt_bench_shape_names(void);
/* "qwen3-30b-a3b-l4|tiny-moe" (the mixture-of-experts shapes) for usage lines. */
const char *lt_bench_moe_shape_names(void);
/* lt_bench_arg parsers of --shape (LT_BENCH_FN): any shape above, or a mixture-of-experts one;
 * *(const char **)dst = v. */
const char *lt_bench_parse_shape(const char *v, void *dst);
const char *lt_bench_parse_moe_shape(const char *v, void *dst);

/* The model config the loader would read from the shape's folder, with the projections, embedding
 * and head held in `dt` (F32 or BF16): what the planner takes without any file. */
lt_model_config lt_bench_shape_config(const lt_bench_shape *s, lt_dtype dt);

/* Base-weight scalars of the shape (projections, experts and routers, embedding, untied head, norms). */
int64_t lt_bench_shape_params(const lt_bench_shape *s);

/* Makes sure `dir` holds a random checkpoint of shape s in dtype dt (F32 or BF16; norms always f32)
 * from `seed`: weights uniform with std 0.02 (transformers' initializer_range), norms 1. An existing
 * complete folder with the same shape, dtype and seed (its "longtune-random" stamp, written last) is
 * reused; anything else there is overwritten. Host memory stays at one 32 MiB chunk (from ctx's
 * accounting allocator), filled by `threads` threads. *written is 1 when the folder was
 * (re)written. Returns 0, or -1 with a message on stderr. */
int lt_bench_random_checkpoint(lt_ctx *ctx, const char *dir, const lt_bench_shape *s, lt_dtype dt, uint64_t seed,
                               int threads, int *written);

/* The default folder for (shape, dtype): $LONGTUNE_BENCH_WEIGHTS/<shape>-<dtype> when that variable
 * is set, else /tmp/longtune-bench-weights/<shape>-<dtype>. */
void lt_bench_random_dir(const lt_bench_shape *s, lt_dtype dt, char *buf, size_t n);

#endif

#include <cjson/cJSON.h>
#include "longtune/status.h"

/* Runs bench/peers/train_peft_gpu.py (under $LONGTUNE_SOURCE_DIR, else the working directory) with
 * `args` appended, PYTHONPATH = peer_path first, stderr passed through, and returns every JSON
 * object it printed on stdout as an array (NULL when it could not be started or printed no
 * {"ready": true} line; the reason goes to stderr). Caller owns the array. */
cJSON *lt_bench_gpu_peer_run(const char *peer_path, const char *args);
/* The same for another peer script, `script` relative to the source folder
 * ("bench/peers/train_moe_peft_gpu.py"). */
cJSON *lt_bench_gpu_peer_run_script(const char *peer_path, const char *script, const char *args);
/* After one of the two returned NULL: "failed to start: " and the reason (the peer's own error line,
 * else its exit status), for a result file's peer entry. Valid until the next peer run. */
const char *lt_bench_peer_failure(void);
/* The first element of a peer's line array with key `key` (and "T" == T when T > 0), or NULL. */
const cJSON *lt_bench_peer_find(const cJSON *lines, const char *key, int64_t T);

/* Loads the shape's random checkpoint (written or reused by lt_bench_random_checkpoint in
 * lt_bench_random_dir) on `dev` with LoRA `lo`. Prints progress to stderr. Errors: those of
 * lt_model_load, LT_ERR_IO when the folder cannot be written. */
lt_status lt_bench_load_random(lt_ctx *ctx, const lt_bench_shape *s, lt_dtype dt, lt_device dev,
                               const lt_lora_options *lo, int threads, lt_model **out);
/* The same loaded with mo (its device, and the dtype the projections are held in: quantize_dtype
 * LT_DTYPE_F32 keeps the file's, LT_DTYPE_FP8 an fp8 base but for fp8_skip's projections). */
lt_status lt_bench_load_random_as(lt_ctx *ctx, const lt_bench_shape *s, lt_dtype dt, const lt_model_options *mo,
                                  const lt_lora_options *lo, int threads, lt_model **out);

/* FLOPs of one training step of T tokens (B = 1) with LoRA rank r on all seven projections of every
 * layer, frozen base, every layer recomputed. P = weight elements of one layer's seven projections,
 * A = causal attention forward of one layer = 2·H·T²·D (FlashAttention's convention: 4·H·T²·D
 * halved for the causal mask), R = r·Σ(in + out) over the seven adapters.
 *   model (MFU):    L·(4·P·T + 6·R·T + 3·A) + 4·V·C·T
 *                   projections forward 2PT + input gradient 2PT (no weight gradient: frozen);
 *                   LoRA forward 2RT + backward 4RT; attention forward A + backward 2A;
 *                   head forward 2VCT + input gradient 2VCT; norms, RoPE, SwiGLU, AdamW left out
 *   hardware (HFU): L·(4·P·T + 2·(P − C·F)·T + 10·R·T + (3.5 + k)·A) + 4·V·C·T
 *                   adds what the recompute runs — the layer's projections except the down
 *                   projection's base product (the model skips it), the LoRA products, and the
 *                   attention forward when it is recomputed (k = 1; k = 0 when its output is kept
 *                   with the checkpoints; k = the share of layers rerunning it when only some do,
 *                   `rerun`) — and counts the attention backward as FlashAttention
 *                   does (2.5·A, which includes recomputing the scores) */
double lt_bench_model_flops(const lt_model_config *cfg, int64_t r, int64_t T);
/* kept_qkv = 1 (the host's kept attention, lt_layout.keep_qkv): the recompute also skips the
 * q, k, v and o projections (base and LoRA) in the layers that keep attention, so hw_flops drops
 * 2·(Pa + Ra)·T per such layer, Pa, Ra those four projections' shares of P and R. */
double lt_bench_hw_flops(const lt_model_config *cfg, int64_t r, int64_t T, double rerun, int kept_qkv);

/* --recompute's value for bench `bench`: all (every layer), every:K and, with allow_none, none
 * (the bench shapes have one layer kind). 0, or after the usage error its exit code (2). */
int lt_bench_parse_recompute(const char *bench, const char *value, int allow_none, lt_recompute *r, int64_t *k);
/* A policy's part of a result file's tag: "" for every layer, "-everyK", "-norecompute". */
void lt_bench_recompute_tag(lt_recompute r, int64_t k, char *buf, size_t n);
/* The FLOP conventions above as one line for result files. */
extern const char *const lt_bench_flops_note;
/* Dense bf16 tensor-core peak of an H100/H200 SXM in FLOP/s (989.4 TFLOP/s; NVIDIA's datasheet
 * figure of 1979 is with 2:4 sparsity): the MFU denominator of the CUDA benches. */
#define LT_BENCH_H200_BF16_PEAK 989.4e12
