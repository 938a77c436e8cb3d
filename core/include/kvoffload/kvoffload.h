/* kvoffload C API: the region, the device runtime and transfer engine, and the manager, for
 * engines written in C or bound from other languages. C99; every symbol is prefixed kvo_.
 *
 * Conventions:
 * - Objects are opaque handles created by kvo_<thing>_create*() and released by the matching
 *   kvo_<thing>_close()/destroy(); passing NULL to a release function is a no-op.
 * - Every fallible function returns a kvo_status (KVO_OK == 0) and writes its results through
 *   out-parameters, which are left untouched on error. No C++ exception ever crosses this boundary.
 * - After a non-OK status, kvo_last_error_message() (and _errno, _call, _code) describe the failure
 *   on the calling thread, with the message of the step that failed. They stay valid until the next
 *   failing call on the same thread; a successful call does not clear them.
 * - A NULL pointer or a bad size gives KVO_INVALID_ARGUMENT with a message naming the argument.
 * - Options structs start with struct_size: initialise them with kvo_*_options_init(), which sets
 *   the defaults and struct_size, so a library built against a newer header can tell them apart.
 *
 * Minimal use (error handling elided):
 *   kvo_region_options o; kvo_region_options_init(&o);
 *   o.engine_id = "engine-0"; o.num_chunks = 1024; o.slot_bytes = 2 << 20; o.world_size = 8; o.rank
 * = 3; kvo_region_t* region; kvo_region_create_or_join(&o, &region); void* slot; uint64_t bytes;
 * kvo_region_slot(region, 17, KVO_OWN_RANK, &slot, &bytes); kvo_region_close(region);
 */
#ifndef KVOFFLOAD_KVOFFLOAD_H
#define KVOFFLOAD_KVOFFLOAD_H

#include <stddef.h>
#include <stdint.h>

#include <kvoffload/error_codes.h>
#include <kvoffload/export.h>
#include <kvoffload/policy_kinds.h>
#include <kvoffload/stats_fields.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exported from libkvoffload.so (see export.h). */
#define KVO_API KVOFFLOAD_API

/* ---------------------------------------------------------------------------------------------
 * Status codes and errors. The values equal kvoffload::ErrorCode and never change.
 * ------------------------------------------------------------------------------------------- */
/* kvo_status: the codes and their names are listed once, in error_codes.h, with what each means:
 *   KVO_OK = 0, KVO_INVALID_ARGUMENT = 1, KVO_CAPACITY, KVO_SYSTEM (see kvo_last_error_errno()),
 *   KVO_TIMEOUT, KVO_MISMATCH, KVO_PERMISSION, KVO_NOT_AVAILABLE, KVO_DEVICE,
 *   KVO_TRANSFER_FAILED, KVO_NOT_FOUND, KVO_STATE, KVO_INTERNAL = 12,
 *   KVO_IN_USE = 13 (kvo_region_create_or_join: the rank slot or the scheduler role is held by
 *   another live process; the message names it and its PID). */
#define KVO_STATUS_ENUMERATOR_(value, upper, camel, name) KVO_##upper = (value),
typedef enum kvo_status { KVOFFLOAD_ERROR_CODES(KVO_STATUS_ENUMERATOR_) } kvo_status;
#undef KVO_STATUS_ENUMERATOR_

/* Message of the last failure on this thread ("" when none). Never NULL. */
KVO_API const char* kvo_last_error_message(void);
/* Status of the last failure on this thread (KVO_OK when none). */
KVO_API kvo_status kvo_last_error_code(void);
/* errno (or device error) of the last failure on this thread, 0 when none was involved. */
KVO_API int kvo_last_error_errno(void);
/* Name of the failing call of the last failure ("fallocate", ...), "" when none. Never NULL. */
KVO_API const char* kvo_last_error_call(void);
/* Stable name of a status ("invalid_argument"); "unknown" for values outside the enum. */
KVO_API const char* kvo_status_name(kvo_status status);
/* Library version, "MAJOR.MINOR.PATCH". */
KVO_API const char* kvo_version(void);

/* ---------------------------------------------------------------------------------------------
 * The shared host region (docs/DESIGN.md §3).
 * ------------------------------------------------------------------------------------------- */
typedef struct kvo_region kvo_region_t;

/* rank value of an unranked mapper (the scheduler) in kvo_region_options, and "this mapper's own
 * rank" in kvo_region_slot(). */
#define KVO_UNRANKED (-1)
#define KVO_OWN_RANK (-1)

typedef enum kvo_region_role { KVO_ROLE_CREATOR = 0, KVO_ROLE_JOINER = 1 } kvo_region_role;
typedef enum kvo_populate_method {
  KVO_POPULATE_MADVISE = 0,
  KVO_POPULATE_FALLBACK = 1,
  KVO_POPULATE_NONE = 2
} kvo_populate_method;

typedef struct kvo_region_options {
  size_t struct_size;        /* sizeof(kvo_region_options), set by kvo_region_options_init */
  const char* engine_id;     /* 1..128 of [A-Za-z0-9._-], not "." or ".."; required */
  uint64_t num_chunks;       /* rows, > 0 */
  uint64_t slot_bytes;       /* P: one rank's bytes per chunk, > 0 */
  uint32_t world_size;       /* ranks of the engine, > 0 (default 1) */
  int replicated;            /* nonzero: MLA layout, every rank shares slot 0 */
  int32_t rank;              /* 0..world_size-1, or KVO_UNRANKED (the default) */
  const char* shm_dir;       /* NULL or "": $KVOFFLOAD_SHM_DIR, else /dev/shm */
  uint32_t join_timeout_ms;  /* how long a joiner waits for the creator (default 30000) */
  uint32_t populate_threads; /* >= 1 (default 1) */
  int populate;              /* nonzero (default): pre-fault after mapping */
  uint64_t slot_align;       /* every slot starts on this boundary: a power of two from 16 to the
                                page size (default 256); all ranks must agree */
} kvo_region_options;

typedef struct kvo_region_geometry {
  uint64_t num_chunks;
  uint64_t slot_bytes;
  uint32_t world_size;
  uint32_t copies; /* world_size, or 1 when replicated */
  int replicated;
  uint64_t row_stride; /* round_up(copies * slot_stride, page_size) */
  uint64_t data_bytes; /* num_chunks * row_stride */
  uint64_t page_size;
  uint64_t slot_align; /* every slot starts on this boundary */
  uint64_t
      slot_stride; /* slot_bytes rounded up to slot_align: rank r's slot is at r * slot_stride */
} kvo_region_geometry;

typedef struct kvo_populate_report {
  kvo_populate_method method;
  uint64_t bytes; /* bytes pre-faulted by this process */
  double seconds;
} kvo_populate_report;

KVO_API kvo_status kvo_region_options_init(kvo_region_options* options);
/* Creates the region, or joins it when another process created it, and takes this mapper's role:
 * its rank slot, or (KVO_UNRANKED) the scheduler role. A role has one holder at a time: while
 * another live process holds it this returns KVO_IN_USE, with a message naming the engine id, the
 * role and the holder's PID. On error nothing is left behind (file, descriptor, mapping) and *out
 * is untouched. */
KVO_API kvo_status kvo_region_create_or_join(const kvo_region_options* options, kvo_region_t** out);
KVO_API kvo_status kvo_region_geometry_get(const kvo_region_t* region, kvo_region_geometry* out);
KVO_API kvo_status kvo_region_role_get(const kvo_region_t* region, kvo_region_role* out);
/* The region file's path; the string lives as long as the handle. */
KVO_API kvo_status kvo_region_path(const kvo_region_t* region, const char** out);
KVO_API kvo_status kvo_region_engine_id(const kvo_region_t* region, const char** out);
/* This mapper's rank, or KVO_UNRANKED. */
KVO_API kvo_status kvo_region_rank(const kvo_region_t* region, int32_t* out);
KVO_API kvo_status kvo_region_populate_report_get(const kvo_region_t* region,
                                                  kvo_populate_report* out);
/* Start of the page-aligned data and its size (data_bytes). */
KVO_API kvo_status kvo_region_data(const kvo_region_t* region, void** out_data,
                                   uint64_t* out_bytes);
/* Rank `rank`'s slot of `chunk` (KVO_OWN_RANK: this mapper's; KVO_STATE for an unranked mapper). */
KVO_API kvo_status kvo_region_slot(const kvo_region_t* region, uint64_t chunk, int32_t rank,
                                   void** out_ptr, uint64_t* out_bytes);
/* The whole row of `chunk` (row_stride bytes: every copy and the padding). */
KVO_API kvo_status kvo_region_row(const kvo_region_t* region, uint64_t chunk, void** out_ptr,
                                  uint64_t* out_bytes);
/* Detaches and frees the handle (always, even when a teardown step failed, which gives
 * KVO_SYSTEM). The last process out removes the file. Pointers into the region become invalid.
 * An engine (kvo_engine_t) built on the region must be destroyed first. */
KVO_API kvo_status kvo_region_close(kvo_region_t* region);
/* Removes stale regions in shm_dir (NULL: the default dir), all or only engine_id's (NULL: all);
 * a region in use is never removed. *out_removed (may be NULL) receives how many were removed. */
KVO_API kvo_status kvo_region_clean(const char* shm_dir, const char* engine_id,
                                    uint32_t* out_removed);

/* ---------------------------------------------------------------------------------------------
 * The device runtime and the transfer engine (docs/DESIGN.md §4, §5).
 * Device pointers, and native stream and event handles, are integers (uint64_t): a cudaStream_t /
 * hipStream_t value for cuda/hip (0 = the legacy default stream), a handle made by
 * kvo_runtime_stream_create for host (0 = "no stream": work runs synchronously).
 * ------------------------------------------------------------------------------------------- */
typedef struct kvo_runtime kvo_runtime_t;
typedef struct kvo_registration kvo_registration_t;
typedef struct kvo_engine kvo_engine_t;

/* backend: "host" | "sim" | "cuda" | "hip" | "auto" (cuda if present, else hip, else host, never
 * sim); device: the device ordinal for cuda/hip. KVO_NOT_AVAILABLE when the backend is not built or
 * has no device. */
KVO_API kvo_status kvo_runtime_create(const char* backend, int device, kvo_runtime_t** out);
/* Destroys the runtime and every stream and event made through it. Engines and registrations
 * using it must be destroyed first. */
KVO_API void kvo_runtime_destroy(kvo_runtime_t* runtime);
/* "host" | "sim" | "cuda" | "hip"; the string lives as long as the runtime. */
KVO_API kvo_status kvo_runtime_name(const kvo_runtime_t* runtime, const char** out);
/* Whether the backend has the SM copy-kernel path (nonzero) or only DMA (0). */
KVO_API kvo_status kvo_runtime_supports_kernel_path(const kvo_runtime_t* runtime, int* out);

/* Streams and events owned by the runtime, named by their native handle. */
KVO_API kvo_status kvo_runtime_stream_create(kvo_runtime_t* runtime, uint64_t* out_stream);
KVO_API kvo_status kvo_runtime_stream_destroy(kvo_runtime_t* runtime, uint64_t stream);
KVO_API kvo_status kvo_runtime_stream_synchronize(kvo_runtime_t* runtime, uint64_t stream);
KVO_API kvo_status kvo_runtime_event_create(kvo_runtime_t* runtime, uint64_t* out_event);
KVO_API kvo_status kvo_runtime_event_destroy(kvo_runtime_t* runtime, uint64_t event);
KVO_API kvo_status kvo_runtime_event_record(kvo_runtime_t* runtime, uint64_t event,
                                            uint64_t stream);
/* *out_done = nonzero when the event's latest record has completed. */
KVO_API kvo_status kvo_runtime_event_query(kvo_runtime_t* runtime, uint64_t event, int* out_done);
KVO_API kvo_status kvo_runtime_event_synchronize(kvo_runtime_t* runtime, uint64_t event);

/* Registers (pins, maps for the device) host memory; align: the unit the registration pieces are
 * aligned to (a region's row stride; 0 = none). The registration is undone by
 * kvo_registration_destroy. A transfer engine registers its host memory itself. */
KVO_API kvo_status kvo_runtime_register_host(kvo_runtime_t* runtime, void* ptr, uint64_t bytes,
                                             uint64_t align, kvo_registration_t** out);
/* The device-side address of host_ptr (inside the registered range) for kernels. */
KVO_API kvo_status kvo_registration_device_pointer(const kvo_registration_t* registration,
                                                   const void* host_ptr, uint64_t* out);
/* Unregisters and frees the handle; KVO_DEVICE when the backend reported a failure. */
KVO_API kvo_status kvo_registration_destroy(kvo_registration_t* registration);

/* Device memory (host memory on the host backend), for engines without their own allocator and
 * for tests. */
KVO_API kvo_status kvo_runtime_device_alloc(kvo_runtime_t* runtime, uint64_t bytes,
                                            uint64_t* out_ptr);
KVO_API kvo_status kvo_runtime_device_free(kvo_runtime_t* runtime, uint64_t ptr);
/* Synchronous copy / fill between any of host and device memory. */
KVO_API kvo_status kvo_runtime_memcpy(kvo_runtime_t* runtime, uint64_t dst, uint64_t src,
                                      uint64_t bytes);
KVO_API kvo_status kvo_runtime_memset(kvo_runtime_t* runtime, uint64_t dst, int value,
                                      uint64_t bytes);

/* One device KV tensor: num_blocks pages of page_bytes, block b at base + b * block_stride. */
typedef struct kvo_device_tensor {
  uint64_t base;         /* device address (e.g. torch tensor.data_ptr()) */
  uint64_t num_blocks;   /* > 0 */
  uint64_t page_bytes;   /* bytes of one block of this tensor, > 0 */
  uint64_t block_stride; /* bytes between blocks, >= page_bytes (0 = page_bytes) */
} kvo_device_tensor;

/* One KV group (e.g. full attention, sliding window): its tensors. */
typedef struct kvo_kv_group {
  const kvo_device_tensor* tensors;
  size_t num_tensors; /* >= 1 */
} kvo_kv_group;

/* Host slots in any host buffer (kvo_engine_create); a region gives these itself. */
typedef struct kvo_host_slots {
  void* base;            /* start of the buffer */
  uint64_t buffer_bytes; /* >= num_chunks * row_stride */
  uint64_t num_chunks;
  uint64_t row_stride;  /* bytes between chunks */
  uint64_t slot_offset; /* this rank's slot within a row */
  uint64_t slot_bytes;
} kvo_host_slots;

typedef struct kvo_engine_options {
  size_t struct_size; /* set by kvo_engine_options_init */
  int register_host;  /* nonzero (default): register the host buffer (needed for kernels) */
  int allow_kernel;   /* nonzero (default): the SM copy-kernel path may be chosen */
  /* Path choice: the kernel when at least *_kernel_min_count pieces of mean size below
   * *_kernel_below_bytes (defaults 32 KiB and 16). */
  uint64_t store_kernel_below_bytes, store_kernel_min_count;
  uint64_t load_kernel_below_bytes, load_kernel_min_count;
  int calibrate; /* nonzero: measure both paths at creation and set the thresholds */
  /* Nonzero (default): time each job's copies (kvo_job_result.seconds, the live page's copy
   * time) with two timing events; 0: no timing event is recorded and seconds stays 0 (for an
   * engine whose statistics do not read copy times). Added after calibrate, in what was
   * the struct's tail padding: struct_size is unchanged, so a caller built against the older
   * header that initialises the struct with kvo_engine_options_init (as it must) gets the
   * library's default here. */
  int job_timing;
} kvo_engine_options;

typedef enum kvo_direction { KVO_STORE = 0, KVO_LOAD = 1 } kvo_direction; /* D2H, H2D */

/* The blocks of one KV group in a job. */
typedef struct kvo_block_list {
  const uint64_t* blocks;
  size_t count;
} kvo_block_list;

/* One job: group g's blocks land at consecutive chunk positions starting at position `skip` of
 * chunks[0]: block i at chunk chunks[(skip + i) / bpc], position (skip + i) % bpc. */
typedef struct kvo_transfer_spec {
  const uint64_t* chunks;
  size_t num_chunks;
  uint32_t skip;                /* < blocks_per_chunk */
  const kvo_block_list* groups; /* one per layout group (count 0 for a group not moved) */
  size_t num_groups;
} kvo_transfer_spec;

typedef enum kvo_wait_kind {
  KVO_WAIT_NOTHING = 0,
  KVO_WAIT_STREAM = 1, /* everything enqueued on the stream so far (the compute stream) */
  KVO_WAIT_EVENT = 2
} kvo_wait_kind;

typedef struct kvo_wait_on {
  kvo_wait_kind kind;
  uint64_t handle; /* the native stream or event */
} kvo_wait_on;

typedef struct kvo_job_result {
  uint64_t job_id;
  kvo_direction direction;
  int success;       /* a failed copy is never reported as a success */
  uint64_t bytes;    /* bytes the job copies (also set for failed jobs) */
  double seconds;    /* copy time on the stream, 0 when failed */
  const char* error; /* "" on success; valid until the next poll/wait call on this thread */
} kvo_job_result;

/* The statistics structs' members come from stats_fields.h, in its order: one uint64_t, double or
 * int member per entry (kvo_engine_stats: jobs_submitted ... last_descriptors, host_registered). */
#define KVO_STATS_MEMBER_(kind, name) KVOFFLOAD_STATS_C_TYPE_##kind name;
#define KVO_STATS_POLICY_MEMBER_(kind, name) KVOFFLOAD_STATS_C_TYPE_##kind policy_##name;

typedef struct kvo_engine_stats {
  KVOFFLOAD_ENGINE_STATS_FIELDS(KVO_STATS_MEMBER_)
} kvo_engine_stats;

KVO_API kvo_status kvo_engine_options_init(kvo_engine_options* options);
/* An engine over this rank's slots of a region (ranked, or replicated). Registers the whole region
 * data; closing the region shuts the engine down first (unregister before munmap), but destroy the
 * engine before kvo_region_close. options may be NULL (defaults). The runtime must outlive it. */
KVO_API kvo_status kvo_engine_create_for_region(kvo_runtime_t* runtime, kvo_region_t* region,
                                                uint32_t rank, const kvo_kv_group* groups,
                                                size_t num_groups, uint32_t blocks_per_chunk,
                                                const kvo_engine_options* options,
                                                kvo_engine_t** out);
/* An engine over slots in any host buffer. */
KVO_API kvo_status kvo_engine_create(kvo_runtime_t* runtime, const kvo_host_slots* host,
                                     const kvo_kv_group* groups, size_t num_groups,
                                     uint32_t blocks_per_chunk, const kvo_engine_options* options,
                                     kvo_engine_t** out);
/* Shuts down (drains both streams) and frees the handle. */
KVO_API void kvo_engine_destroy(kvo_engine_t* engine);
/* Refuses new jobs and drains both streams; results stay available to poll/wait. Idempotent. */
KVO_API kvo_status kvo_engine_shutdown(kvo_engine_t* engine);
/* Plans and enqueues a job after `wait_on`, returns at once. KVO_INVALID_ARGUMENT for a bad spec
 * or an id still in flight (nothing enqueued), KVO_STATE after shutdown. */
KVO_API kvo_status kvo_engine_submit(kvo_engine_t* engine, uint64_t job_id, kvo_direction direction,
                                     const kvo_transfer_spec* spec, kvo_wait_on wait_on);
/* Results of finished jobs, at most `capacity` (the rest stay for the next call). */
KVO_API kvo_status kvo_engine_poll(kvo_engine_t* engine, kvo_job_result* out, size_t capacity,
                                   size_t* out_count);
/* Blocks until every listed job finished; out[i] is job_ids[i]'s result (out has `count`
 * entries). KVO_NOT_FOUND for an id not pending (never submitted, or already collected). */
KVO_API kvo_status kvo_engine_wait(kvo_engine_t* engine, const uint64_t* job_ids, size_t count,
                                   kvo_job_result* out);
/* Blocks until every submitted job finished; returns up to `capacity` uncollected results (the
 * rest stay for poll). */
KVO_API kvo_status kvo_engine_wait_all(kvo_engine_t* engine, kvo_job_result* out, size_t capacity,
                                       size_t* out_count);
KVO_API kvo_status kvo_engine_stats_get(const kvo_engine_t* engine, kvo_engine_stats* out);

/* ---------------------------------------------------------------------------------------------
 * The rank-side worker (docs/DESIGN.md §7.4): one rank assembled and torn down in one place.
 * kvo_worker_create probes the backend, makes the runtime on the rank's device, maps the region
 * ranked with each bring-up piece registered with the device as it comes up, and builds the
 * transfer engine over the pieces; kvo_worker_close undoes it in the one safe order (the engine
 * drains, the caches are freed, the bring-up stops, the pieces unregister, the region unmaps, the
 * runtime goes last), as does a failed create.
 *
 * Bring-up: KVO_BRINGUP_BLOCKING returns with the whole pool up; KVO_BRINGUP_BACKGROUND returns
 * once the region is mapped and brings the pool up piece by piece while the rank serves. Pieces
 * grow: the first is min(bringup_first_piece_bytes, bringup_piece_bytes), each next twice the last
 * up to bringup_piece_bytes. A job may use only chunks below kvo_worker_bringup.ready_chunks on
 * every rank: the caller's scheduler hands out only those (it reads every rank's prefix from the
 * region header); the engine does not check.
 * ------------------------------------------------------------------------------------------- */
typedef struct kvo_worker kvo_worker_t;

typedef enum kvo_bringup_mode {
  KVO_BRINGUP_BLOCKING = 0,
  KVO_BRINGUP_BACKGROUND = 1
} kvo_bringup_mode;
/* Values equal kvoffload::BringupState (stored in the region header) and never change. */
typedef enum kvo_bringup_state {
  KVO_BRINGUP_PENDING = 0,
  KVO_BRINGUP_RUNNING = 1,
  KVO_BRINGUP_READY = 2,
  KVO_BRINGUP_FAILED = 3,
  KVO_BRINGUP_STOPPED = 4
} kvo_bringup_state;

typedef struct kvo_worker_options {
  size_t struct_size;           /* set by kvo_worker_options_init */
  kvo_region_options region;    /* initialised too; region.rank is required (0..world_size-1) */
  const char* backend;          /* "auto" (default, NULL too) | "host" | "sim" | "cuda" | "hip" */
  int device;                   /* -1 (default): device rank mod the backend's count; else >= 0 */
  kvo_bringup_mode bringup;     /* default KVO_BRINGUP_BLOCKING */
  uint64_t bringup_piece_bytes; /* largest piece, > 0 (default 1 GiB) */
  uint64_t bringup_first_piece_bytes; /* > 0 (default 64 MiB) */
  /* The device KV: the engine's own tensors (groups, num_groups) or, with num_groups 0, caches
   * the worker allocates on its device (cache_tensors tensors of cache_num_blocks blocks of
   * cache_block_bytes, blocks packed; one group). Exactly one of the two. */
  const kvo_kv_group* groups;
  size_t num_groups;
  uint32_t cache_tensors;
  uint64_t cache_num_blocks;
  uint64_t cache_block_bytes;
  uint32_t blocks_per_chunk;        /* > 0 */
  const kvo_engine_options* engine; /* NULL: defaults; register_host is ignored (the worker
                                       registers the pieces) */
} kvo_worker_options;

typedef struct kvo_worker_bringup {
  kvo_bringup_state state;
  uint64_t ready_chunks;     /* rows [0, ready_chunks) are up and registered on this rank */
  uint64_t num_chunks;       /* the region's rows */
  uint64_t ready_bytes;      /* ready_chunks * row_stride */
  uint64_t pieces;           /* pieces registered with the device so far */
  uint64_t registered_bytes; /* bytes registered with the device so far */
  double seconds;            /* from create until ready or failed (so far while running) */
  double register_seconds;   /* in register calls, all pieces */
  double longest_piece_seconds;
  int error_status; /* the kvo_status of a failed bring-up, else KVO_OK */
} kvo_worker_bringup;

KVO_API kvo_status kvo_worker_options_init(kvo_worker_options* options);
/* Builds the rank (see above). On error everything built is released and *out is untouched. */
KVO_API kvo_status kvo_worker_create(const kvo_worker_options* options, kvo_worker_t** out);
/* The rank's transfer engine, owned by the worker: valid until kvo_worker_close, which shuts it
 * down; kvo_engine_destroy on it does nothing. Jobs go through the kvo_engine_* calls. */
KVO_API kvo_status kvo_worker_engine(kvo_worker_t* worker, kvo_engine_t** out);
/* The device the rank uses, and the region's geometry. */
KVO_API kvo_status kvo_worker_device(const kvo_worker_t* worker, int* out);
KVO_API kvo_status kvo_worker_geometry_get(const kvo_worker_t* worker, kvo_region_geometry* out);
/* This rank's slot of `chunk` (host memory; the bytes are meaningful only below ready_chunks). */
KVO_API kvo_status kvo_worker_slot(const kvo_worker_t* worker, uint64_t chunk, void** out_ptr,
                                   uint64_t* out_bytes);
/* Device address of block `block` of tensor `tensor` of the caches the worker allocated
 * (KVO_STATE when the engine gave its own groups). */
KVO_API kvo_status kvo_worker_cache_block(const kvo_worker_t* worker, uint32_t tensor,
                                          uint64_t block, uint64_t* out_ptr);
/* The bring-up so far (thread-safe, never blocks). */
KVO_API kvo_status kvo_worker_bringup_get(const kvo_worker_t* worker, kvo_worker_bringup* out);
/* Blocks until the bring-up is no longer running: KVO_OK when the pool is up, else the failure's
 * status and message (KVO_STATE when it was stopped). */
KVO_API kvo_status kvo_worker_wait_bringup(const kvo_worker_t* worker);
/* Closes the rank in the safe order and frees the handle (always; KVO_SYSTEM when a teardown step
 * failed, logged). NULL is ignored. */
KVO_API kvo_status kvo_worker_close(kvo_worker_t* worker);

/* ---------------------------------------------------------------------------------------------
 * The manager (docs/DESIGN.md §6): which KV chunks live in the region's chunk slots. The scheduler
 * side of an engine uses it. A kvo_manager_t may be shared between threads: calls are serialised.
 * Arrays of keys are (pointer, count); a NULL pointer is allowed only with count 0. Output arrays
 * have room for at least `count` elements (for the keys given).
 * ------------------------------------------------------------------------------------------- */
typedef struct kvo_manager kvo_manager_t;

/* A 128-bit block key (an engine's block hash): hi is the most significant half. */
typedef struct kvo_block_key {
  uint64_t hi;
  uint64_t lo;
} kvo_block_key;

#define KVO_NO_SLOT UINT32_MAX

/* kvo_policy: the eviction policy kinds are listed once, in policy_kinds.h: KVO_POLICY_LRU = 0,
 * KVO_POLICY_ARC = 1. */
#define KVO_POLICY_ENUMERATOR_(value, upper, camel, name) KVO_POLICY_##upper = (value),
typedef enum kvo_policy { KVOFFLOAD_POLICY_KINDS(KVO_POLICY_ENUMERATOR_) } kvo_policy;
#undef KVO_POLICY_ENUMERATOR_
typedef enum kvo_lookup_result { KVO_MISS = 0, KVO_HIT = 1, KVO_HIT_PENDING = 2 } kvo_lookup_result;
typedef enum kvo_cannot_store_reason {
  KVO_STORE_REASON_NONE = 0,
  KVO_STORE_REASON_NO_EVICTABLE_SPACE = 1, /* the rest are pinned, pending or protected */
  KVO_STORE_REASON_TOO_MANY_KEYS = 2       /* more new keys than the region has slots */
} kvo_cannot_store_reason;
typedef enum kvo_event_kind { KVO_EVENT_STORED = 0, KVO_EVENT_REMOVED = 1 } kvo_event_kind;

typedef struct kvo_manager_options {
  size_t struct_size;                  /* set by kvo_manager_options_init */
  uint64_t num_chunks;                 /* slots in the region, 1 .. 2^32-2; required */
  kvo_policy policy;                   /* default KVO_POLICY_LRU */
  uint32_t store_threshold;            /* 0 (default): store every key; N: only after N lookups */
  uint64_t threshold_tracker_capacity; /* 0: max(num_chunks, 1024) */
  int record_events;                   /* nonzero (default): keep events for take_events */
} kvo_manager_options;

/* What kvo_manager_prepare_store did. ok == 0: nothing allocated, nothing evicted (reason). */
typedef struct kvo_store_plan {
  int ok;
  kvo_cannot_store_reason reason;
  size_t num_keys;            /* keys_out[0..num_keys) go to slots_out[0..num_keys) */
  size_t num_evicted;         /* evicted_out[0..num_evicted) */
  uint64_t skipped_present;   /* already stored or pending (or repeated in the call) */
  uint64_t skipped_threshold; /* looked up fewer than store_threshold times */
  uint64_t slots_needed;
  uint64_t slots_available;
} kvo_store_plan;

typedef struct kvo_manager_event {
  kvo_event_kind kind;
  const kvo_block_key* keys;
  size_t num_keys;
} kvo_manager_event;

/* num_chunks, used, write_pending, pinned, evictable, usage (double), ..., loads_completed, then
 * the eviction policy's counters policy_resident ... policy_recent_target (ARC names; LRU reports
 * residents as recent): stats_fields.h. */
typedef struct kvo_manager_stats {
  KVOFFLOAD_MANAGER_STATS_FIELDS(KVO_STATS_MEMBER_)
  KVOFFLOAD_POLICY_COUNTERS_FIELDS(KVO_STATS_POLICY_MEMBER_)
} kvo_manager_stats;

/* Parses 1..32 hex digits (most significant first) into a key. */
KVO_API kvo_status kvo_block_key_parse_hex(const char* text, kvo_block_key* out);
/* Writes 32 lower-case hex digits and a NUL to out (at least 33 bytes: out_size). */
KVO_API kvo_status kvo_block_key_to_hex(kvo_block_key key, char* out, size_t out_size);

KVO_API kvo_status kvo_manager_options_init(kvo_manager_options* options);
KVO_API kvo_status kvo_manager_create(const kvo_manager_options* options, kvo_manager_t** out);
KVO_API void kvo_manager_destroy(kvo_manager_t* manager);

/* Per-key results into results (NULL to skip) and the hit prefix: how many leading keys are
 * KVO_HIT. Counts toward the store threshold and the statistics; no recency change. */
KVO_API kvo_status kvo_manager_lookup(kvo_manager_t* manager, const kvo_block_key* keys,
                                      size_t count, kvo_lookup_result* results,
                                      size_t* out_hit_prefix);
/* Allocates write-pending slots for the keys not present, evicting as needed (never a key of this
 * call, of protected_keys, nor a pinned or pending chunk), all or nothing. keys_out and slots_out
 * receive plan->num_keys entries; evicted_out (NULL: evicted keys are reported only as `removed`
 * events) receives plan->num_evicted. Running out of room is not an error: plan->ok == 0. */
KVO_API kvo_status kvo_manager_prepare_store(kvo_manager_t* manager, const kvo_block_key* keys,
                                             size_t count, const kvo_block_key* protected_keys,
                                             size_t protected_count, kvo_block_key* keys_out,
                                             uint32_t* slots_out, kvo_block_key* evicted_out,
                                             kvo_store_plan* plan);
/* Ends stores (each key write-pending): success makes them ready, failure frees the slots. */
KVO_API kvo_status kvo_manager_complete_store(kvo_manager_t* manager, const kvo_block_key* keys,
                                              size_t count, int success);
/* Pins each (ready) key for one reader and writes its slot to slots_out. */
KVO_API kvo_status kvo_manager_prepare_load(kvo_manager_t* manager, const kvo_block_key* keys,
                                            size_t count, uint32_t* slots_out);
/* Releases one pin per key occurrence. */
KVO_API kvo_status kvo_manager_complete_load(kvo_manager_t* manager, const kvo_block_key* keys,
                                             size_t count);
/* Marks keys as used now in prefix order (keys[0] ends most recent); absent keys are ignored. */
KVO_API kvo_status kvo_manager_touch(kvo_manager_t* manager, const kvo_block_key* keys,
                                     size_t count);
/* Drops every key (a `removed` event). KVO_STATE while a store is pending or a chunk pinned. */
KVO_API kvo_status kvo_manager_reset(kvo_manager_t* manager);
/* One key's state, slot (KVO_NO_SLOT when absent) and pin count; any out may be NULL. */
KVO_API kvo_status kvo_manager_query(kvo_manager_t* manager, kvo_block_key key,
                                     kvo_lookup_result* out_state, uint32_t* out_slot,
                                     uint32_t* out_pins);
/* Events since the previous call, oldest first (removed before stored within one operation).
 * The array and the key arrays it points to are owned by the manager and stay valid until the
 * next kvo_manager_take_events on it or kvo_manager_destroy. */
KVO_API kvo_status kvo_manager_take_events(kvo_manager_t* manager,
                                           const kvo_manager_event** out_events, size_t* out_count);
KVO_API kvo_status kvo_manager_stats_get(kvo_manager_t* manager, kvo_manager_stats* out);
KVO_API kvo_status kvo_manager_reset_stats(kvo_manager_t* manager);

/* ---------------------------------------------------------------------------------------------
 * Remote tier configuration (kvoffload::RemoteTierOptions): a distributed store shared by
 * engines on several machines. url: redis://host:port[/db], redis-cluster://host:port[,...] or
 * memcached://host:port[,...]. Times in milliseconds. Engines whose geometry fields differ get
 * different fingerprints and never read each other's values.
 * ------------------------------------------------------------------------------------------- */
typedef enum kvo_remote_kind {
  KVO_REMOTE_REDIS = 0,
  KVO_REMOTE_REDIS_CLUSTER = 1,
  KVO_REMOTE_MEMCACHED = 2
} kvo_remote_kind;

typedef struct kvo_remote_tier_options {
  uint32_t struct_size;      /* set by kvo_remote_tier_options_init */
  const char* url;           /* required */
  uint64_t slot_bytes;       /* geometry: bytes of one rank's slot of one chunk (> 0) */
  uint32_t world_size;       /* geometry: ranks (> 0) */
  int replicated;            /* geometry: one copy shared by all ranks (MLA) */
  const char* tensor_layout; /* geometry: how a slot packs tensors (NULL: "") */
  uint64_t block_bytes;      /* geometry: one GPU block of one tensor (0: not given) */
  uint32_t blocks_per_chunk; /* geometry (0: not given) */
  const char* dtype;         /* geometry: element type tag (NULL: "bytes") */
  uint32_t connect_timeout_ms;
  uint32_t lookup_timeout_ms; /* budget of an existence check; then a miss */
  uint32_t get_timeout_ms;
  uint32_t put_timeout_ms;
  uint64_t max_inflight_bytes; /* per node */
  uint64_t max_queued_bytes;   /* per node; puts beyond it fail at once */
  uint32_t connections_per_node;
  uint32_t breaker_failures; /* consecutive failures that open a node's circuit */
  uint32_t breaker_backoff_ms;
  uint32_t breaker_backoff_max_ms;
  uint32_t negative_ttl_ms;
  uint64_t memcached_item_max; /* memcached -I of the servers */
} kvo_remote_tier_options;

/* The defaults of kvoffload::RemoteTierOptions (url NULL, slot_bytes 0: both must be set). */
KVO_API kvo_status kvo_remote_tier_options_init(kvo_remote_tier_options* options);
/* Parses the URL and checks every field; KVO_INVALID_ARGUMENT with a message naming the field
 * (or what is wrong with the URL). Touches no network. */
KVO_API kvo_status kvo_remote_tier_options_validate(const kvo_remote_tier_options* options);
/* The URL's kind and node count (after validation). */
KVO_API kvo_status kvo_remote_tier_url_info(const kvo_remote_tier_options* options,
                                            kvo_remote_kind* out_kind, size_t* out_nodes);
/* The geometry fingerprint that namespaces this engine's keys. */
KVO_API kvo_status kvo_remote_tier_fingerprint(const kvo_remote_tier_options* options,
                                               uint64_t* out_fingerprint);
/* Bytes of one stored value (slot bytes + the 64-byte header). */
KVO_API uint64_t kvo_remote_value_bytes(uint64_t slot_bytes);

/* ---------------------------------------------------------------------------------------------
 * The node pool (docs/DESIGN.md §6.6): one KV chunk pool per node shared by every engine that
 * attaches, with no server. A kvo_pool_t is one tenant; it may be shared between threads (calls
 * are serialised). Output arrays have room for `count` elements. Running out of room is counted
 * in kvo_pool_store, never an error; a stopped holder of the pool's lock makes a call fail with
 * KVO_TIMEOUT naming its PID after lock_timeout_ms.
 * ------------------------------------------------------------------------------------------- */
typedef struct kvo_pool kvo_pool_t;

typedef struct kvo_pool_options {
  size_t struct_size;    /* set by kvo_pool_options_init */
  const char* name;      /* the pool, 1..128 of [A-Za-z0-9._-]; required */
  const char* engine_id; /* this tenant, same rule; unique among live tenants; required */
  const char* shm_dir;   /* NULL or "": $KVOFFLOAD_SHM_DIR, else /dev/shm */
  uint64_t slot_bytes;   /* every tenant must agree on these six (KVO_MISMATCH otherwise) */
  uint32_t slot_count;
  uint32_t world_size;        /* default 1 */
  const char* layout;         /* 1..31 characters */
  const char* dtype;          /* 1..31 characters */
  const char* fingerprint;    /* model fingerprint / key namespace, 1..255 characters */
  uint32_t max_tenants;       /* creator only; default 16, at most 64 */
  uint64_t cap_bytes;         /* per-tenant cap (whole chunks); 0: none */
  double cap_fraction;        /* or a fraction (0, 1] of slot_count; 0: none */
  uint32_t lock_timeout_ms;   /* default 5000 */
  uint32_t sweep_interval_ms; /* liveness sweep of the other tenants; default 1000 */
  kvo_policy policy;          /* node-wide eviction, fixed by the creator; default KVO_POLICY_LRU;
                                 a joiner asking for the other one gets KVO_MISMATCH */
} kvo_pool_options;

typedef struct kvo_pool_lookup {
  uint32_t hits;              /* the ready prefix; slots_out[0..hits) */
  uint32_t cross_engine_hits; /* of which another engine stored */
} kvo_pool_lookup;

typedef struct kvo_pool_store {
  size_t num_slots;   /* keys[positions_out[i]] goes to slots_out[i], i < num_slots */
  size_t num_evicted; /* evicted_out[0..num_evicted) */
  uint32_t skipped_present, skipped_writing, skipped_no_room, skipped_cap;
} kvo_pool_store;

typedef struct kvo_pool_stats {
  uint64_t slot_count, free, writing, ready, pinned, repairs, tenants_reclaimed;
  uint32_t tenants; /* live tenants */
  /* This tenant's counters. */
  uint64_t lookup_keys, hits, cross_engine_hits, stores_prepared, stores_committed, stores_aborted,
      evictions, pins, pinned_slots, occupancy;
  /* The pool's policy and ARC's state (LRU: recent = every resident, the rest 0). */
  kvo_policy policy;
  uint64_t arc_target, recent, frequent, ghost_recent, ghost_frequent;
} kvo_pool_stats;

KVO_API kvo_status kvo_pool_options_init(kvo_pool_options* options);
/* Creates the pool file or joins it (docs/DESIGN.md §6.6 for what is refused). */
KVO_API kvo_status kvo_pool_attach(const kvo_pool_options* options, kvo_pool_t** out);
/* Detaches the tenant (pins and writing slots dropped, ready chunks stay; the last tenant removes
 * the pool) and frees the handle. NULL is ignored. */
KVO_API void kvo_pool_close(kvo_pool_t* pool);
/* The ready prefix of keys, touched or (pin != 0) pinned for this tenant; slots_out may be NULL. */
KVO_API kvo_status kvo_pool_lookup_keys(kvo_pool_t* pool, const kvo_block_key* keys, size_t count,
                                        int pin, uint32_t* slots_out, kvo_pool_lookup* out);
/* Writing slots for the keys neither ready nor being written; evicted_out may be NULL. */
KVO_API kvo_status kvo_pool_prepare_stores(kvo_pool_t* pool, const kvo_block_key* keys,
                                           size_t count, uint32_t* positions_out,
                                           uint32_t* slots_out, kvo_block_key* evicted_out,
                                           kvo_pool_store* out);
KVO_API kvo_status kvo_pool_commit_stores(kvo_pool_t* pool, const uint32_t* slots, size_t count);
KVO_API kvo_status kvo_pool_abort_stores(kvo_pool_t* pool, const uint32_t* slots, size_t count);
KVO_API kvo_status kvo_pool_unpin(kvo_pool_t* pool, const uint32_t* slots, size_t count);
/* The address of rank's slot_bytes of chunk slot (valid until kvo_pool_close):
 * kvo_pool_rank_range's data + slot * slot_stride. */
KVO_API kvo_status kvo_pool_chunk(kvo_pool_t* pool, uint32_t slot, uint32_t rank, void** out);
/* One rank's part of the chunk bytes: the pool is rank-major, so rank r's slot of every chunk is
 * one range; a rank process maps only [file_offset, file_offset + bytes) of the pool file and
 * registers it with its device (1/world_size of the chunk bytes). */
typedef struct kvo_pool_rank_range {
  void* data;           /* in this tenant's mapping: the slot of chunk 0 */
  uint64_t bytes;       /* slot_count * slot_stride rounded up to a page */
  uint64_t file_offset; /* where the range starts in the pool file (a page multiple) */
  uint64_t slot_stride; /* bytes between consecutive chunks' slots (slot_bytes rounded to 256) */
} kvo_pool_rank_range;
/* KVO_INVALID_ARGUMENT for a rank >= world_size. */
KVO_API kvo_status kvo_pool_rank_range_get(kvo_pool_t* pool, uint32_t rank,
                                           kvo_pool_rank_range* out);
KVO_API kvo_status kvo_pool_reclaim_dead_tenants(kvo_pool_t* pool, uint32_t* out_reclaimed);
/* KVO_OK when every invariant of the shared index holds; else KVO_INTERNAL with the violations
 * in kvo_last_error_message(). */
KVO_API kvo_status kvo_pool_check_invariants(kvo_pool_t* pool);
KVO_API kvo_status kvo_pool_stats_get(kvo_pool_t* pool, kvo_pool_stats* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVOFFLOAD_KVOFFLOAD_H */
