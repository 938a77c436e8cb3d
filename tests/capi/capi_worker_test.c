/* The rank-side worker through the C API (C99): blocking and background bring-up on the host
 * backend, stores served from the ready prefix while the pool comes up, every byte verified,
 * the pieces' sizes and registrations, refusals naming the value, and nothing left behind.
 * Exits non-zero on the first failure with the file:line and the library's last error message. */
/* NOLINTNEXTLINE(bugprone-reserved-identifier): the POSIX feature macro */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kvoffload/kvoffload.h>

static int checks = 0;

#define FAIL(...)                                                                              \
  do {                                                                                         \
    (void)fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                      \
    (void)fprintf(stderr, __VA_ARGS__);                                                        \
    (void)fprintf(stderr, "\n  last error: [%s] %s\n", kvo_status_name(kvo_last_error_code()), \
                  kvo_last_error_message());                                                   \
    exit(1);                                                                                   \
  } while (0)

#define CHECK(cond)                               \
  do {                                            \
    ++checks;                                     \
    if (!(cond)) FAIL("check failed: %s", #cond); \
  } while (0)

#define CHECK_OK(expr)                                                    \
  do {                                                                    \
    kvo_status s_ = (expr);                                               \
    ++checks;                                                             \
    if (s_ != KVO_OK) FAIL("%s returned %s", #expr, kvo_status_name(s_)); \
  } while (0)

/* The call fails with `code` and the last error message contains `needle` (non-empty). */
#define CHECK_ERR(expr, code, needle)                                                         \
  do {                                                                                        \
    kvo_status s_ = (expr);                                                                   \
    ++checks;                                                                                 \
    if ((needle)[0] == '\0') FAIL("%s: CHECK_ERR needs a non-empty needle", #expr);           \
    if (s_ != (code))                                                                         \
      FAIL("%s returned %s, expected %s", #expr, kvo_status_name(s_), kvo_status_name(code)); \
    if (strstr(kvo_last_error_message(), (needle)) == NULL)                                   \
      FAIL("message of %s lacks \"%s\"", #expr, (needle));                                    \
  } while (0)

enum { kChunks = 64, kSlot = 64 * 1024, kBpc = 2, kBlock = kSlot / kBpc / 2 /* 2 tensors */ };

static char shm_dir[256];

/* Files left in the test's directory (a closed worker leaves none). */
static int files_left(void) {
  int n = 0;
  struct dirent* e;
  DIR* d = opendir(shm_dir);
  if (d == NULL) FAIL("opendir %s", shm_dir);
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] != '.') ++n;
  }
  (void)closedir(d);
  return n;
}

static void options(kvo_worker_options* o, const char* id, kvo_bringup_mode mode) {
  CHECK_OK(kvo_worker_options_init(o));
  o->region.engine_id = id;
  o->region.shm_dir = shm_dir;
  o->region.num_chunks = kChunks;
  o->region.slot_bytes = kSlot;
  o->region.rank = 0;
  o->backend = "host";
  o->bringup = mode;
  o->bringup_first_piece_bytes = kSlot;         /* one row */
  o->bringup_piece_bytes = 4 * (uint64_t)kSlot; /* up to four rows */
  o->cache_tensors = 2;
  o->cache_num_blocks = 8;
  o->cache_block_bytes = kBlock;
  o->blocks_per_chunk = kBpc;
}

static unsigned char byte_of(uint64_t chunk, uint32_t tensor, uint64_t pos, size_t i) {
  return (unsigned char)(chunk * 131u + tensor * 17u + pos * 5u + i);
}

/* Stores cache blocks 0..kBpc-1 into `chunk` after filling them with the chunk's pattern, then
 * checks every byte of the chunk's host slot (tensor-major within the slot: tensor t's blocks at
 * t * kBpc * kBlock). Loads it back into blocks kBpc.. and checks those too. */
static void store_and_verify(kvo_worker_t* w, kvo_engine_t* e, uint64_t chunk, uint64_t job) {
  uint64_t blocks[kBpc], back[kBpc];
  uint32_t t;
  uint64_t p;
  size_t i;
  kvo_block_list list;
  kvo_transfer_spec spec;
  kvo_wait_on nothing = {KVO_WAIT_NOTHING, 0};
  kvo_job_result r;
  void* slot;
  uint64_t slot_bytes;
  for (p = 0; p < kBpc; ++p) {
    blocks[p] = p;
    back[p] = kBpc + p;
    for (t = 0; t < 2; ++t) {
      uint64_t addr;
      unsigned char* b;
      CHECK_OK(kvo_worker_cache_block(w, t, p, &addr));
      b = (unsigned char*)(uintptr_t)addr; /* host backend: device memory is host memory */
      for (i = 0; i < kBlock; ++i) b[i] = byte_of(chunk, t, p, i);
      CHECK_OK(kvo_worker_cache_block(w, t, kBpc + p, &addr));
      memset((void*)(uintptr_t)addr, 0, kBlock);
    }
  }
  list.blocks = blocks;
  list.count = kBpc;
  spec.chunks = &chunk;
  spec.num_chunks = 1;
  spec.skip = 0;
  spec.groups = &list;
  spec.num_groups = 1;
  CHECK_OK(kvo_engine_submit(e, job, KVO_STORE, &spec, nothing));
  CHECK_OK(kvo_engine_wait(e, &job, 1, &r));
  CHECK(r.success && r.bytes == (uint64_t)2 * kBpc * kBlock);
  CHECK_OK(kvo_worker_slot(w, chunk, &slot, &slot_bytes));
  CHECK(slot_bytes == kSlot);
  for (t = 0; t < 2; ++t) {
    for (p = 0; p < kBpc; ++p) {
      const unsigned char* s = (const unsigned char*)slot + ((uint64_t)t * kBpc + p) * kBlock;
      for (i = 0; i < kBlock; ++i) {
        if (s[i] != byte_of(chunk, t, p, i))
          FAIL("chunk %llu tensor %u block %llu byte %zu differs", (unsigned long long)chunk, t,
               (unsigned long long)p, i);
      }
    }
  }
  list.blocks = back;
  job += 1;
  CHECK_OK(kvo_engine_submit(e, job, KVO_LOAD, &spec, nothing));
  CHECK_OK(kvo_engine_wait(e, &job, 1, &r));
  CHECK(r.success);
  for (t = 0; t < 2; ++t) {
    for (p = 0; p < kBpc; ++p) {
      uint64_t addr;
      const unsigned char* b;
      CHECK_OK(kvo_worker_cache_block(w, t, kBpc + p, &addr));
      b = (const unsigned char*)(uintptr_t)addr;
      for (i = 0; i < kBlock; ++i) {
        if (b[i] != byte_of(chunk, t, p, i))
          FAIL("loaded chunk %llu differs", (unsigned long long)chunk);
      }
    }
  }
}

/* Pieces of rows the bring-up makes: first, then doubling up to max (Note [Growing pieces]). */
static uint64_t expected_pieces(uint64_t rows, uint64_t first, uint64_t max) {
  uint64_t n = 0, at = 0, next = first;
  while (at < rows) {
    at += next < rows - at ? next : rows - at;
    next = next * 2 > max ? max : next * 2;
    ++n;
  }
  return n;
}

static void test_defaults_and_refusals(void) {
  kvo_worker_options o;
  kvo_worker_t* w = (kvo_worker_t*)&o; /* must stay untouched on error */
  kvo_worker_t* const sentinel = w;
  CHECK_OK(kvo_worker_options_init(&o));
  CHECK(o.struct_size == sizeof o && o.region.struct_size == sizeof o.region);
  CHECK(o.bringup == KVO_BRINGUP_BLOCKING && o.device == -1 && strcmp(o.backend, "auto") == 0);
  CHECK(o.bringup_piece_bytes == (uint64_t)1 << 30 && o.bringup_first_piece_bytes == 64u << 20);
  CHECK(o.region.rank == KVO_UNRANKED && o.engine == NULL && o.num_groups == 0);
  CHECK_ERR(kvo_worker_options_init(NULL), KVO_INVALID_ARGUMENT, "'options'");
  CHECK_ERR(kvo_worker_create(NULL, &w), KVO_INVALID_ARGUMENT, "'options'");

  options(&o, "capi-worker-bad", KVO_BRINGUP_BACKGROUND);
  CHECK_ERR(kvo_worker_create(&o, NULL), KVO_INVALID_ARGUMENT, "'out'");
  o.struct_size = 8;
  CHECK_ERR(kvo_worker_create(&o, &w), KVO_INVALID_ARGUMENT, "kvo_worker_options_init");
  options(&o, "capi-worker-bad", KVO_BRINGUP_BACKGROUND);
  o.region.rank = KVO_UNRANKED;
  CHECK_ERR(kvo_worker_create(&o, &w), KVO_INVALID_ARGUMENT, "options->region.rank");
  options(&o, "capi-worker-bad", (kvo_bringup_mode)7);
  CHECK_ERR(kvo_worker_create(&o, &w), KVO_INVALID_ARGUMENT, "is 7; use KVO_BRINGUP_BLOCKING");
  options(&o, "capi-worker-bad", KVO_BRINGUP_BACKGROUND);
  o.bringup_piece_bytes = 0;
  CHECK_ERR(kvo_worker_create(&o, &w), KVO_INVALID_ARGUMENT, "bringup_piece_bytes");
  options(&o, "capi-worker-bad", KVO_BRINGUP_BACKGROUND);
  o.bringup_first_piece_bytes = 0;
  CHECK_ERR(kvo_worker_create(&o, &w), KVO_INVALID_ARGUMENT, "bringup_first_piece_bytes");
  options(&o, "capi-worker-bad", KVO_BRINGUP_BACKGROUND);
  o.device = -2;
  CHECK_ERR(kvo_worker_create(&o, &w), KVO_INVALID_ARGUMENT, "is -2");
  options(&o, "capi-worker-bad", KVO_BRINGUP_BACKGROUND);
  o.backend = "tpu";
  CHECK_ERR(kvo_worker_create(&o, &w), KVO_INVALID_ARGUMENT, "'tpu'");
  options(&o, "capi-worker-bad", KVO_BRINGUP_BACKGROUND);
  o.cache_tensors = 0;
  o.cache_num_blocks = 0;
  o.cache_block_bytes = 0;
  CHECK_ERR(kvo_worker_create(&o, &w), KVO_INVALID_ARGUMENT, "no KV groups and no caches");
  /* A directory that does not exist: the region fails after the runtime exists. */
  options(&o, "capi-worker-bad", KVO_BRINGUP_BACKGROUND);
  o.region.shm_dir = "/nonexistent/kvoffload-capi-worker";
  CHECK(kvo_worker_create(&o, &w) != KVO_OK);
  CHECK(w == sentinel);
  CHECK(files_left() == 0);

  CHECK_OK(kvo_worker_close(NULL));
  CHECK_ERR(kvo_worker_bringup_get(NULL, NULL), KVO_INVALID_ARGUMENT, "'out'");
  CHECK_ERR(kvo_worker_wait_bringup(NULL), KVO_INVALID_ARGUMENT, "'worker'");
  CHECK_ERR(kvo_worker_engine(NULL, NULL), KVO_INVALID_ARGUMENT, "'out'");
}

static void test_blocking(void) {
  kvo_worker_options o;
  kvo_worker_t *w, *twin;
  kvo_engine_t *e, *e2;
  kvo_worker_bringup b;
  kvo_region_geometry g;
  int device = -5;
  uint64_t addr;
  options(&o, "capi-worker-blocking", KVO_BRINGUP_BLOCKING);
  CHECK_OK(kvo_worker_create(&o, &w));
  CHECK_OK(kvo_worker_bringup_get(w, &b));
  CHECK(b.state == KVO_BRINGUP_READY && b.ready_chunks == kChunks && b.num_chunks == kChunks);
  CHECK_OK(kvo_worker_geometry_get(w, &g));
  CHECK(g.num_chunks == kChunks && g.slot_bytes == kSlot && g.row_stride == kSlot);
  CHECK(b.ready_bytes == g.data_bytes && b.registered_bytes == g.data_bytes);
  CHECK(b.pieces == expected_pieces(kChunks, 1, 4) && b.error_status == KVO_OK);
  CHECK_OK(kvo_worker_wait_bringup(w));
  CHECK_OK(kvo_worker_device(w, &device));
  CHECK(device == 0);
  CHECK_ERR(kvo_worker_cache_block(w, 2, 0, &addr), KVO_INVALID_ARGUMENT, "is 2");
  CHECK_ERR(kvo_worker_cache_block(w, 0, 8, &addr), KVO_INVALID_ARGUMENT, "is 8");
  CHECK_ERR(kvo_worker_slot(w, kChunks, (void**)&addr, &addr), KVO_INVALID_ARGUMENT, "64");
  /* The same rank twice: refused naming the holder; the refused one leaves nothing behind. */
  CHECK_ERR(kvo_worker_create(&o, &twin), KVO_IN_USE, "capi-worker-blocking");
  CHECK_OK(kvo_worker_engine(w, &e));
  CHECK_OK(kvo_worker_engine(w, &e2));
  CHECK(e == e2);
  kvo_engine_destroy(e); /* the worker's engine: does nothing */
  store_and_verify(w, e, 0, 1);
  store_and_verify(w, e, kChunks - 1, 3);
  CHECK_OK(kvo_worker_close(w));
  CHECK(files_left() == 0);
}

static void test_background(void) {
  kvo_worker_options o;
  kvo_worker_t* w;
  kvo_engine_t* e;
  kvo_worker_bringup b;
  uint64_t served = 0, job = 100, last_ready = 0, polls = 0;
  const struct timespec pause = {0, 200000};
  options(&o, "capi-worker-background", KVO_BRINGUP_BACKGROUND);
  CHECK_OK(kvo_worker_create(&o, &w));
  CHECK_OK(kvo_worker_engine(w, &e));
  /* Serve every chunk as soon as it is in the ready prefix, never beyond it. */
  for (;;) {
    CHECK_OK(kvo_worker_bringup_get(w, &b));
    CHECK(b.ready_chunks >= last_ready && b.ready_chunks <= kChunks);
    CHECK(b.state == KVO_BRINGUP_RUNNING || b.state == KVO_BRINGUP_READY ||
          b.state == KVO_BRINGUP_PENDING);
    CHECK(b.registered_bytes >= b.ready_bytes);
    last_ready = b.ready_chunks;
    while (served < b.ready_chunks) {
      store_and_verify(w, e, served, job);
      job += 2;
      ++served;
    }
    if (b.state == KVO_BRINGUP_READY) break;
    ++polls;
    (void)nanosleep(&pause, NULL);
  }
  CHECK(served == kChunks);
  CHECK_OK(kvo_worker_wait_bringup(w));
  CHECK_OK(kvo_worker_bringup_get(w, &b));
  CHECK(b.pieces == expected_pieces(kChunks, 1, 4) && b.registered_bytes == b.ready_bytes);
  CHECK(b.seconds >= 0.0 && b.longest_piece_seconds <= b.register_seconds);
  CHECK_OK(kvo_worker_close(w));
  CHECK(files_left() == 0);
  (void)polls;
}

/* Closed while the bring-up is still running: the pieces unregister, nothing is left. */
static void test_close_during_bringup(void) {
  kvo_worker_options o;
  kvo_worker_t* w;
  options(&o, "capi-worker-early-close", KVO_BRINGUP_BACKGROUND);
  o.region.num_chunks = 1024; /* 64 MiB, one row at a time at first */
  CHECK_OK(kvo_worker_create(&o, &w));
  CHECK_OK(kvo_worker_close(w));
  CHECK(files_left() == 0);
}

int main(void) {
  char tmpl[] = "/tmp/kvoffload-capi-worker-XXXXXX";
  char cmd[300];
  if (mkdtemp(tmpl) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  (void)snprintf(shm_dir, sizeof shm_dir, "%s", tmpl);
  test_defaults_and_refusals();
  test_blocking();
  test_background();
  test_close_during_bringup();
  (void)snprintf(cmd, sizeof cmd, "rm -rf '%s'", shm_dir);
  if (system(cmd) != 0) (void)fprintf(stderr, "warning: could not remove %s\n", shm_dir);
  (void)printf("capi_worker_test: %d checks passed\n", checks);
  return 0;
}
