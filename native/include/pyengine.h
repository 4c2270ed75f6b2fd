/* pyengine — the public C API of the inference engine.
 *
 * Conventions (see STYLE.md):
 * - Every fallible call returns int32_t: PE_OK (0) or a negative PE_ERR_* code, and writes its
 *   results through out-parameters. pe_last_error() then describes the failure; it is
 *   per-thread and valid until the next failing call on the same thread.
 * - No C++ exception crosses this boundary.
 * - Handles are opaque; each *_create has a matching *_free. Buffers passed in are owned by the
 *   caller and only read during the call unless a comment says otherwise.
 * - The part between cffi-begin and cffi-end is parsed by cffi's cdef (pyengine/_native.py):
 *   keep it free of other preprocessor directives than integer #defines.
 */
#ifndef PYENGINE_H
#define PYENGINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cffi-begin */
#define PE_API_VERSION 8

/* Status codes. */
#define PE_OK 0
#define PE_ERR_INVALID_ARGUMENT -1 /* a value the caller passed is wrong (message names it) */
#define PE_ERR_NOT_FOUND -2        /* unknown tensor name, request id ... */
#define PE_ERR_OUT_OF_MEMORY -3    /* an allocation or the memory plan failed */
#define PE_ERR_UNSUPPORTED -4      /* valid but not supported by this build or backend */
#define PE_ERR_STATE -5            /* call not allowed in the object's current state */
#define PE_ERR_INTERNAL -6         /* a bug: please report the message */

/* Element types (values match pe::DType). */
#define PE_DTYPE_F32 0
#define PE_DTYPE_F16 1
#define PE_DTYPE_BF16 2
#define PE_DTYPE_FP8_E4M3 3
#define PE_DTYPE_I8 4
#define PE_DTYPE_I32 5
#define PE_DTYPE_NVFP4 6 /* e2m1 + a scale per 16 values (KV cache, quantized weights) */

/* Layer kinds of pe_model_config.layer_types. */
#define PE_LAYER_LINEAR_ATTENTION 0
#define PE_LAYER_FULL_ATTENTION 1

/* Event kinds and finish reasons of pe_event. */
#define PE_EVENT_TOKEN 1    /* one new token (with logprobs when asked) */
#define PE_EVENT_FINISHED 2 /* the request ended; finish_reason says why */
#define PE_EVENT_PROGRESS 3 /* a prefill chunk of the prompt was computed (prompt_* fields) */
#define PE_FINISH_NONE 0
#define PE_FINISH_STOP 1      /* eos or a stop token id */
#define PE_FINISH_LENGTH 2    /* max_tokens or the context length */
#define PE_FINISH_CANCELLED 3 /* pe_engine_cancel */
#define PE_FINISH_ERROR 4     /* error_message in the event says why */

#define PE_MAX_TOP_LOGPROBS 20

/* Speculative decoding: proposers of pe_engine_params.speculative_algorithm, and the most draft
 * tokens a verify step takes per sequence (also the length of the per-position counters). */
#define PE_SPEC_NONE 0
#define PE_SPEC_MTP 1    /* the checkpoint's MTP head drafts k tokens in a chain */
#define PE_SPEC_DFLASH 2 /* a DFlash draft model (pe_draft) proposes a block of drafts */
#define PE_SPEC_MAX_DRAFT 8
#define PE_ERROR_MESSAGE_SIZE 256

/* Library version and build. */
int32_t pe_api_version(void);
/* Static string such as "cpu" or "cpu,cuda(75;90)". */
const char* pe_build_info(void);
/* 1 when `device` ("cpu", "cuda") can run models in this build on this machine, else 0. */
int32_t pe_device_available(const char* device);
/* Message of the last failing call on this thread ("" if none). Owned by the library. */
const char* pe_last_error(void);

/* ---- Model: configuration and weights ------------------------------------------------------ */

/* The text-model fields of a Qwen3.5 config.json (either layout; Python reads the file).
 * layer_types points to num_hidden_layers PE_LAYER_* values; it is copied by pe_model_create. */
typedef struct pe_model_config {
  int32_t vocab_size;
  int32_t hidden_size;
  int32_t num_hidden_layers;
  int32_t intermediate_size;
  int32_t num_attention_heads;
  int32_t num_key_value_heads;
  int32_t head_dim;
  int32_t linear_num_key_heads;
  int32_t linear_num_value_heads;
  int32_t linear_key_head_dim;
  int32_t linear_value_head_dim;
  int32_t linear_conv_kernel_dim;
  float rms_norm_eps;
  float rope_theta;
  float partial_rotary_factor;
  int32_t tie_word_embeddings;
  int32_t mtp_num_hidden_layers;
  int32_t max_position_embeddings;
  const int32_t* layer_types;
} pe_model_config;

typedef struct pe_model pe_model;

/* Creates an empty model for cfg on `device` ("cpu"; "cuda" when built with CUDA and a GPU is
 * present: weights, KV cache, GDN state, activations and sampling then live on the GPU).
 * Errors: INVALID_ARGUMENT naming the config field; UNSUPPORTED for a device not built or absent. */
int32_t pe_model_create(const pe_model_config* cfg, const char* device, pe_model** out_model);

/* Hands one checkpoint tensor to the model, which copies it (data may be unmapped after the
 * call). `name` is the checkpoint name without the "model." / "model.language_model." prefix,
 * e.g. "layers.0.linear_attn.in_proj_qkv.weight", "embed_tokens.weight", "lm_head.weight",
 * "mtp.fc.weight"; FP8 block scales come as "<weight name>_scale_inv".
 * Errors: NOT_FOUND for a name the model does not have; INVALID_ARGUMENT for a wrong shape or
 * dtype (the message names the tensor, the expected and the given value). */
int32_t pe_model_set_tensor(pe_model* model, const char* name, int32_t dtype, int32_t ndim,
                            const int64_t* shape, const void* data);

/* Checks that every tensor is present (the message names the first missing one), then prepares
 * the weights for the backend. After it, no more pe_model_set_tensor. */
int32_t pe_model_finalize(pe_model* model);

/* On-load weight quantization, applied at pe_model_finalize to every layer matrix loaded as
 * F32/F16/BF16: PE_DTYPE_I8 (per output channel), PE_DTYPE_FP8_E4M3 (128x128 block scales),
 * PE_DTYPE_NVFP4 (e2m1, fp8 scale per 16, fp32 global scale); PE_DTYPE_F32 turns it off.
 * embed_tokens and lm_head are kept as loaded. Call before pe_model_finalize. */
int32_t pe_model_set_weight_quant(pe_model* model, int32_t dtype);

/* Whether FP8 layer matrices keep a row-major copy beside the GEMV layout, for the W8A8 prefill
 * GEMM of a CUDA device of compute capability 9.0 (built with CUTLASS): each prefill GEMM then
 * reads the copy instead of untiling its weight first (on the 27B shape ~18 ms of every
 * prefill-holding step on an H100), for the FP8 matrices' bytes again in device memory.
 * -1 auto (default: where the copies take at most a quarter of the GPU's memory), 0 off, 1 on;
 * nothing is kept where that GEMM does not run. Call before pe_model_finalize / pe_model_load_dummy. */
int32_t pe_model_set_prefill_weight_copy(pe_model* model, int32_t mode);

/* load_format "dummy": fills every tensor of the config with random values (matrices as
 * matrix_dtype: F32, F16, BF16 or FP8_E4M3 with block scales; on a CUDA model generated on the
 * GPU) and finalizes, instead of pe_model_set_tensor + pe_model_finalize. For benchmarks. */
int32_t pe_model_load_dummy(pe_model* model, int32_t matrix_dtype, uint64_t seed);

/* Bytes the model's weights take (device memory for a CUDA model). */
int32_t pe_model_weight_bytes(pe_model* model, int64_t* out_bytes);

/* Of those, the bytes of the row-major copies kept for the prefill GEMM (pe_model_set_prefill_weight_copy;
 * 0 where none were kept): a decode step reads the weights without them. */
int32_t pe_model_prefill_copy_bytes(pe_model* model, int64_t* out_bytes);

/* Frees the model. Engines using it must be freed first. NULL is allowed. */
void pe_model_free(pe_model* model);

/* Runs tokens[0..n) as one fresh sequence (no cache kept) and writes the logits of every
 * position to out_logits [n, vocab_size] fp32 (caller-owned). Thread-safe with respect to
 * engines of the same model (it uses its own state). */
int32_t pe_model_prompt_logits(pe_model* model, const int32_t* tokens, int64_t n,
                               float* out_logits);

/* The same with the KV cache stored as kv_cache_dtype (PE_DTYPE_F32, F16, BF16, FP8_E4M3, I8,
 * NVFP4), to measure what a quantized KV cache costs in accuracy. */
int32_t pe_model_prompt_logits_kv(pe_model* model, const int32_t* tokens, int64_t n,
                                  int32_t kv_cache_dtype, float* out_logits);

/* The MTP head over tokens[0..n) as one fresh sequence: row p (0 .. n-2) is the head's draft
 * logits for position p + 2, from the model's final-normed hidden state at p and the token at
 * p + 1. out_logits [n - 1, vocab_size]. Errors: UNSUPPORTED when the checkpoint has no mtp.*. */
int32_t pe_model_mtp_logits(pe_model* model, const int32_t* tokens, int64_t n, float* out_logits);

/* The residual stream after the target's decoder layers layer_ids[0 .. n_layer_ids) (0-based,
 * before the final norm: a DFlash draft's context features) for tokens[0..n) run as one fresh
 * sequence: out_features [n, n_layer_ids * hidden_size] fp32 (caller-owned), layer j's at columns
 * j * hidden_size. Errors: INVALID_ARGUMENT for a layer id outside the model. */
int32_t pe_model_layer_features(pe_model* model, const int32_t* tokens, int64_t n, const int32_t* layer_ids,
                                int32_t n_layer_ids, float* out_features);

/* ---- DFlash draft: a block-diffusion drafter conditioned on a target model ------------------- */

/* The fields of a DFlash draft's config.json (Python reads the file and resolves the defaults of
 * the public format). target_layer_ids points to n_target_layers ids; copied by pe_draft_create. */
typedef struct pe_draft_config {
  int32_t hidden_size;          /* must equal the target's (the draft uses its embedding) */
  int32_t num_hidden_layers;
  int32_t num_attention_heads;
  int32_t num_key_value_heads;
  int32_t head_dim;
  int32_t intermediate_size;
  int32_t vocab_size;           /* must equal the target's (its lm_head) */
  float rms_norm_eps;
  float rope_theta;
  int32_t block_size;           /* 2 .. 64: the draft proposes block_size - 1 tokens */
  int32_t mask_token_id;
  int32_t n_target_layers;
  const int32_t* target_layer_ids;
} pe_draft_config;

typedef struct pe_draft pe_draft;

/* Creates an empty DFlash draft for the finalized `target`, on the target's device. The target
 * must outlive the draft. Errors: INVALID_ARGUMENT naming the config field (sizes that differ from
 * the target's, layer ids out of range); STATE when the target is not finalized; UNSUPPORTED for a
 * tensor-parallel target. */
int32_t pe_draft_create(pe_model* target, const pe_draft_config* cfg, pe_draft** out_draft);

/* One checkpoint tensor of the draft ("fc.weight", "layers.0.self_attn.q_proj.weight", ...),
 * copied. Errors as pe_model_set_tensor (the message names the tensor). */
int32_t pe_draft_set_tensor(pe_draft* draft, const char* name, int32_t dtype, int32_t ndim, const int64_t* shape,
                            const void* data);

/* On-load quantization of the draft's matrices (draft_quant): PE_DTYPE_I8, FP8_E4M3, NVFP4;
 * PE_DTYPE_F32 turns it off. Before pe_draft_finalize. */
int32_t pe_draft_set_weight_quant(pe_draft* draft, int32_t dtype);

/* Checks that every tensor is present (the message names the first missing one) and places them. */
int32_t pe_draft_finalize(pe_draft* draft);

int32_t pe_draft_weight_bytes(pe_draft* draft, int64_t* out_bytes);

/* Frees the draft (before its target). NULL is allowed. */
void pe_draft_free(pe_draft* draft);

/* Drafts blocks over tokens[0..n) as one fresh sequence, the context given in pieces as an engine
 * gives it: for b = 0 .. n_blocks-1 the draft appends the context rows of positions
 * context_ends[b-1] .. context_ends[b] - 1 (context_ends[-1] = 0) to its KV cache (of
 * kv_cache_dtype, a PE_DTYPE_*), then drafts the block at position context_ends[b], whose first
 * token is tokens[context_ends[b]]. context_ends must be non-decreasing and < n. features
 * [context_ends[n_blocks-1], n_target_layers * hidden_size] fp32: the target's layer outputs at
 * those positions; NULL: the target computes them from the tokens. out_logits [n_blocks,
 * block_size - 1, vocab_size] (caller-owned): row j of block b proposes the token at
 * context_ends[b] + 1 + j. */
int32_t pe_draft_block_logits(pe_draft* draft, const int32_t* tokens, int64_t n, const float* features,
                              const int64_t* context_ends, int32_t n_blocks, int32_t kv_cache_dtype,
                              float* out_logits);

/* ---- Tensor parallel: one process per rank ---------------------------------------------------- */

typedef struct pe_comm pe_comm;

/* Joins the CPU communicator group `name` (ranks on this machine, meeting in shared memory) as
 * `rank` of `size`. Rank 0 creates the group; the others wait for it up to join_timeout_s.
 * A rank that dies or aborts makes the others' collectives fail with a message naming it.
 * Errors: INVALID_ARGUMENT (rank, size, name), STATE (timeout). Free with pe_comm_free. */
int32_t pe_comm_create_cpu(const char* name, int32_t rank, int32_t size, double join_timeout_s,
                           pe_comm** out_comm);

/* NCCL (CUDA builds): rank 0 makes the group's id (128 bytes, out_id), hands it to the others out
 * of band; every rank then makes its communicator on the CUDA backend's stream. Errors:
 * UNSUPPORTED with the reason when NCCL is not available (not found at build or at run time). */
int32_t pe_nccl_unique_id(uint8_t* out_id);
int32_t pe_comm_create_nccl(const uint8_t* id, int32_t rank, int32_t size, pe_comm** out_comm);

/* Marks the group failed with `why` (peers' collectives then fail). */
int32_t pe_comm_abort(pe_comm* comm, const char* why);
void pe_comm_free(pe_comm* comm);

/* Makes `model` the rank's shard of a tensor-parallel group, before any pe_model_set_tensor: the
 * tensors handed over afterwards are the checkpoint's whole tensors, and the model keeps its
 * rank's part (heads, MLP columns, vocabulary rows). `data` carries the forward's collectives (NCCL
 * for CUDA, the CPU communicator for the CPU), `control` the leader's messages to the workers (a
 * CPU communicator; may be `data` on the CPU). Both must outlive the model. Errors:
 * INVALID_ARGUMENT naming what does not divide by the group's size. */
int32_t pe_model_set_tp(pe_model* model, pe_comm* data, pe_comm* control);

/* A worker rank (rank > 0) serves the leader's forwards until the leader stops the group (returns
 * PE_OK) or the group fails (returns the error; the message names the rank). Blocks. */
int32_t pe_model_serve_tp_worker(pe_model* model);

/* ---- Engine: continuous batching over a model ---------------------------------------------- */

typedef struct pe_engine_params {
  int32_t max_batch;             /* concurrent sequences (honoured exactly or create fails) */
  int32_t max_model_len;         /* context length per sequence (prompt + output) */
  int32_t chunked_prefill_size;  /* prefill tokens per request per step */
  int32_t max_num_batched_tokens;/* token budget of one step (0: max_batch + chunked_prefill_size) */
  int32_t cooperative_prefill;   /* 1: admit waiting requests at every chunk boundary */
  int32_t prefix_cache;          /* 1: reuse KV blocks and GDN snapshots across requests */
  int32_t kv_page_size;          /* tokens per KV page (a prefix-cache block) */
  int32_t snapshot_interval_pages;/* GDN snapshot every N pages of a prompt (and at its end) */
  int64_t kv_cache_bytes;        /* memory budget for KV pages + GDN slots (0: default) */
  float gpu_mem_ratio;           /* share of free device memory to use (CUDA) */
  int32_t num_threads;           /* CPU worker threads (0: all cores) */
  int32_t kv_cache_dtype;        /* PE_DTYPE_*: F32 (CPU default), F16, BF16, FP8_E4M3, I8, NVFP4 */
  int32_t eos_token_ids[8];      /* ids that end a request unless ignore_eos (-1: unused) */
  int32_t cuda_graphs;           /* CUDA: replay decode steps from captured graphs (0: off) */
  int32_t overlap_schedule;      /* 1: queue the next decode step before reading the current one's
                                    tokens; 0: one step at a time; -1: on for CUDA, off on the CPU */
  float max_step_ms;             /* time limit of a step that gives some request a token (one that
                                    decodes, or a prompt that ends in it): the step's other prefill
                                    is cut to fit, as the engine's step-cost model (measured as steps
                                    run) predicts. > 0: this many milliseconds; 0: derived per step,
                                    its decode rows plus the least prefill that keeps a long prefill
                                    at 80 % of its full-chunk rate (where none can: prefill taking
                                    80 % of the step); < 0: off, prefill always in full chunks.
                                    Finite values only. */
  int32_t speculative_algorithm; /* PE_SPEC_*: NONE (default), MTP (needs mtp.* tensors) or DFLASH
                                    (needs speculative_draft) */
  int32_t speculative_num_draft_tokens; /* k, the most drafts per verify step: 1 .. PE_SPEC_MAX_DRAFT
                                    (each request adapts its own k within it to its acceptance);
                                    DFLASH: at most the draft's block_size - 1 */
  pe_draft* speculative_draft;   /* DFLASH: the draft (pe_draft_create on this model, finalized);
                                    not owned, it must outlive the engine. NULL otherwise */
} pe_engine_params;

/* Defaults: max_batch 8, max_model_len 8192, chunked_prefill_size 512, cooperative_prefill 1,
 * prefix_cache 1, kv_page_size 16, snapshot_interval_pages 16, gpu_mem_ratio 0.9, no eos,
 * kv_cache_dtype F32, cuda_graphs 0, overlap_schedule -1, max_step_ms 0, speculative_algorithm
 * NONE, speculative_num_draft_tokens 3, speculative_draft NULL. */
pe_engine_params pe_engine_default_params(void);

typedef struct pe_memory_plan {
  int64_t kv_page_size;               /* tokens per page */
  int64_t kv_page_bytes;              /* bytes per page over all attention layers (a DFlash
                                         draft's cache on the same pages included) */
  int64_t kv_pages;                   /* pages in the pool */
  int64_t gdn_slot_bytes;             /* bytes of one GDN state slot (conv + recurrent, all layers) */
  int64_t gdn_slots;                  /* slots for running sequences (== max_batch) */
  int64_t snapshot_slots;             /* extra slots for prefix-cache snapshots */
  int64_t context_tokens_per_session; /* tokens each of max_batch sessions can hold at once */
  int64_t sessions_at_full_context;   /* sessions that fit with max_model_len each */
  int64_t budget_bytes;               /* the budget the plan was made from */
  int64_t used_bytes;                 /* pages + slots + snapshots */
  int64_t spec_state_slots;           /* GDN slots holding the state after each draft position
                                         during a verify (max_batch x k; counted in gdn_slots' bytes
                                         of used_bytes) */
  int64_t kv_layers;                  /* attention layers a KV page holds: the model's, + 1 for
                                         the MTP head's own KV when it drafts */
} pe_memory_plan;

typedef struct pe_engine pe_engine;

/* Plans memory, allocates the pools and starts the engine thread. The model must outlive it.
 * Errors: OUT_OF_MEMORY when max_batch / max_model_len cannot fit (the message gives the
 * numbers); INVALID_ARGUMENT naming a bad field. */
int32_t pe_engine_create(pe_model* model, const pe_engine_params* params, pe_engine** out_engine);

/* Stops the thread (requests in flight end with PE_FINISH_CANCELLED) and frees everything. */
void pe_engine_free(pe_engine* engine);

typedef struct pe_sampling_params {
  float temperature;        /* 0: greedy */
  float top_p;              /* (0, 1] */
  float min_p;              /* [0, 1] */
  int32_t top_k;            /* 0: off */
  uint64_t seed;            /* counter-based RNG seed */
  float presence_penalty;
  float frequency_penalty;
  float repetition_penalty; /* 1: off */
  int32_t max_tokens;       /* >= 1 */
  int32_t ignore_eos;
  const int32_t* stop_token_ids; /* copied at add */
  int32_t n_stop_token_ids;
  int32_t logprobs;         /* -1: none; n >= 0: token logprob and top-n (n <= 20) */
  int32_t token_mask;       /* 1: each token waits for its pe_engine_set_token_mask (grammars) */
  int32_t speculative;      /* 1: drafted and verified when the engine speculates (a request with
                               token_mask runs without: its masks come one token at a time);
                               0: plain decode */
} pe_sampling_params;

/* Queues a request and returns at once with its id (ids start at 1). Thread-safe.
 * Errors: INVALID_ARGUMENT for an empty prompt, a token id outside the vocabulary, a prompt
 * longer than max_model_len - 1, or a bad sampling value (the message names it). */
int32_t pe_engine_add_request(pe_engine* engine, const int32_t* tokens, int64_t n_tokens,
                              const pe_sampling_params* sampling, uint64_t* out_request_id);

/* Queues n_requests requests (prompt i: tokens[i][0, n_tokens[i]), sampling[i]) in one step of
 * the engine's inbox, so the engine thread sees all of them or none: a batch added together is
 * admitted at the same step boundary (in this order, as far as max_batch and memory allow),
 * whatever the timing of the caller. Every request is validated before any is queued; when one is
 * invalid nothing is queued, no id is used, and the message names the first bad request and the
 * problem as pe_engine_add_request would ("request 2: prompt is empty"). out_request_ids receives
 * the n_requests ids (consecutive, in order). The arrays are only read during the call.
 * Thread-safe. Errors: INVALID_ARGUMENT for n_requests < 1, a null array, or a bad request. */
int32_t pe_engine_add_requests(pe_engine* engine, int32_t n_requests, const int32_t* const* tokens,
                               const int64_t* n_tokens, const pe_sampling_params* sampling,
                               uint64_t* out_request_ids);

/* Asks the engine to drop a request at the next chunk or step boundary; its FINISHED event
 * follows with PE_FINISH_CANCELLED. Unknown or finished ids are ignored (PE_OK). Thread-safe.
 * A request cancelled mid-prefill leaves its computed prompt blocks in the prefix cache, with
 * the GDN state at the last block boundary it reached, so the same prompt sent again resumes
 * there. */
int32_t pe_engine_cancel(pe_engine* engine, uint64_t request_id);

/* The allowed tokens for the token_index-th generated token (0 = the first) of a request added
 * with token_mask = 1: bit (t % 32) of mask[t / 32] set = token t may be sampled. mask NULL
 * (n_words 0): this token is unconstrained. The engine copies the words. Such a request's
 * step computes its logits, then waits for this call before sampling (a mask with no allowed
 * token is ignored); with no mask after 60 s the request ends with PE_FINISH_ERROR. Call it for
 * index 0 after the add and for index i + 1 after reading token i's event. Unknown or finished
 * ids are ignored (PE_OK). Thread-safe.
 * Errors: INVALID_ARGUMENT when n_words is not ceil(vocab_size / 32) (or 0 with a NULL mask). */
int32_t pe_engine_set_token_mask(pe_engine* engine, uint64_t request_id, int64_t token_index,
                                 const uint32_t* mask, int32_t n_words);

typedef struct pe_event {
  uint64_t request_id;
  int32_t kind;                 /* PE_EVENT_* */
  int32_t token;                /* PE_EVENT_TOKEN: the new token id */
  float logprob;                /* when logprobs >= 0 */
  int32_t n_top;
  int32_t top_ids[20];
  float top_logprobs[20];
  int32_t finish_reason;        /* PE_EVENT_FINISHED */
  int64_t step;                 /* engine step that produced it */
  double time;                  /* monotonic seconds */
  int64_t prompt_tokens;        /* FINISHED, PROGRESS: prompt length */
  int64_t cached_tokens;        /* FINISHED, PROGRESS: prompt tokens served from the prefix cache */
  int64_t prompt_computed;      /* PROGRESS: prompt tokens in place (cached ones included) */
  char error_message[256];      /* PE_FINISH_ERROR */
  /* FINISHED: the request's speculative drafts per draft position (1-based position i at [i - 1])
   * and how many of them were accepted; zeros without speculation. */
  int32_t spec_drafted[8];
  int32_t spec_accepted[8];
} pe_event;

/* Moves up to max_events pending events into `out`, waiting up to timeout_ms for the first
 * (0: do not wait). *n_out = number written. Thread-safe; events of one request stay ordered. */
int32_t pe_engine_poll(pe_engine* engine, pe_event* out, int32_t max_events, int32_t timeout_ms,
                       int32_t* n_out);

/* Values the engine observed: counts[i] of them in (upper_bounds[i - 1], upper_bounds[i]]
 * (i = 0: <= upper_bounds[0]), counts[n_bounds] above the last bound. Counts are per bucket, not
 * cumulative; count and sum over all values. */
#define PE_HISTOGRAM_BOUNDS 16
typedef struct pe_histogram {
  int32_t n_bounds;
  double upper_bounds[PE_HISTOGRAM_BOUNDS];
  int64_t counts[PE_HISTOGRAM_BOUNDS + 1];
  int64_t count;
  double sum;
} pe_histogram;

typedef struct pe_engine_stats {
  int32_t running;
  int32_t waiting;
  int64_t steps;
  int64_t kv_pages_total;
  int64_t kv_pages_free;          /* not held by running requests (cached pages count as free) */
  int64_t kv_pages_cached;        /* pages held only by the prefix cache */
  int64_t gdn_slots_total;
  int64_t gdn_slots_free;
  int64_t snapshot_slots_total;
  int64_t snapshot_slots_used;
  int64_t prefix_cache_hit_tokens;/* total prompt tokens served from the cache */
  int64_t prompt_tokens;          /* total prompt tokens computed */
  int64_t generated_tokens;
  int64_t device_bytes_in_use;    /* CUDA: device memory in use now (driver view); CPU: 0 */
  int64_t device_bytes_baseline;  /* the same right after the engine started */
  int64_t overlapped_steps;       /* steps queued before the previous step's tokens were read */
  int64_t overlap_dropped_tokens; /* tokens such steps computed for requests that had ended */
  /* The last step, as planned (max_step_ms) and as measured. */
  double max_step_ms;             /* the engine option (> 0 a limit, 0 derived per step, < 0 off) */
  int64_t step_decode_rows;       /* decode rows (tokens of requests that are decoding) */
  int64_t step_prefill_tokens;
  int32_t step_paced;             /* 1: its prefill was sized to step_limit_ms */
  double step_limit_ms;           /* its time limit (paced steps; else 0) */
  double step_predicted_ms;       /* the cost model's prediction (0 while the model is not ready) */
  double step_headroom;           /* under a fixed max_step_ms, steps are fitted with predictions
                                     times this (>= 1): recent paced steps' overrun (step_pacer.h) */
  double step_ms;                 /* measured: from planning (or the previous step's end, for a step
                                     queued before it) to its tokens read back */
  int64_t paced_steps;            /* steps planned to a time limit */
  /* The step-cost model: ms = base + decode_row * rows + prefill_step (when the step prefills)
   * + prefill_token * tokens + attention * attended (query, key) pairs / 1e6, fitted to the
   * measured steps, times a scale per class of step. */
  int32_t cost_model_ready;       /* 1 once it paces steps: it has measured prefill steps, and a
                                     decode-only step or prefill steps of two sizes */
  int64_t cost_model_steps;       /* steps it learned from */
  double cost_base_ms;
  double cost_decode_row_ms;
  double cost_prefill_step_ms;
  double cost_prefill_token_ms;
  double cost_attention_ms;       /* per million attended pairs */
  double cost_scale_decode_only;  /* measured / fitted time of decode-only steps, */
  double cost_scale_prefill_only; /* of steps without decode rows, */
  double cost_scale_mixed;        /* of steps with both: predictions are scaled by their class's */
  pe_histogram step_seconds;      /* measured step times */
  pe_histogram decode_itl_seconds;/* time between a request's consecutive tokens, in the engine */
  pe_histogram prefill_tokens_per_step;
  /* Speculative decoding, over all requests: verify steps (one per sequence and step), drafts
   * proposed and accepted per draft position (position i at [i - 1]), tokens emitted by verify
   * steps (accepted drafts + one each); mean accepted length = spec_emitted_tokens / spec_verifies. */
  int64_t spec_verifies;
  int64_t spec_emitted_tokens;
  int64_t spec_drafted[8];
  int64_t spec_accepted[8];
  double spec_propose_seconds;    /* time the proposer took after steps (its cache and the drafts):
                                     part of step_seconds, so a verify step alone is the rest */
} pe_engine_stats;

int32_t pe_engine_get_stats(pe_engine* engine, pe_engine_stats* out);
int32_t pe_engine_get_plan(pe_engine* engine, pe_memory_plan* out);
/* cffi-end */

#ifdef __cplusplus
}
#endif
#endif /* PYENGINE_H */
