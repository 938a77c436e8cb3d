/* The node pool through the C API (C99): two tenants with verified bytes, a second process, a
 * refused fingerprint and bad arguments. Exits non-zero on the first failure with the file:line and
 * the library's last error message. */
/* NOLINTNEXTLINE(bugprone-reserved-identifier): the POSIX feature macro */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* The call fails with `code` and the last error message contains `needle`, which must not be
 * empty (an empty needle is found in every message, so the check could not fail). */
#define CHECK_ERR(expr, code, needle)                                                         \
  do {                                                                                        \
    kvo_status s_ = (expr);                                                                   \
    ++checks;                                                                                 \
    if ((needle)[0] == '\0') FAIL("%s: CHECK_ERR needs a non-empty needle", #expr);           \
    if (s_ != (code))                                                                         \
      FAIL("%s returned %s, expected %s", #expr, kvo_status_name(s_), kvo_status_name(code)); \
    if (kvo_last_error_code() != (code)) FAIL("kvo_last_error_code() disagrees");             \
    if (strstr(kvo_last_error_message(), (needle)) == NULL)                                   \
      FAIL("message of %s lacks \"%s\"", #expr, (needle));                                    \
  } while (0)

#include <sys/stat.h>
#include <sys/wait.h>

static void options(kvo_pool_options* o, const char* dir, const char* engine) {
  CHECK_OK(kvo_pool_options_init(o));
  o->name = "cpool";
  o->engine_id = engine;
  o->shm_dir = dir;
  o->slot_bytes = 100;
  o->slot_count = 4;
  o->world_size = 2;
  o->layout = "layer_major";
  o->dtype = "bf16";
  o->fingerprint = "model/ns";
}

static unsigned char byte_of(uint64_t key, uint32_t rank, size_t i) {
  return (unsigned char)(key * 31u + rank * 7u + i);
}

/* Stores keys (lo = key, hi = 0) with their bytes; returns how many were stored. */
static size_t store(kvo_pool_t* p, const uint64_t* ids, size_t n) {
  kvo_block_key keys[8];
  uint32_t positions[8], slots[8];
  kvo_pool_store st;
  size_t i, b;
  uint32_t r;
  for (i = 0; i < n; ++i) {
    keys[i].hi = 0;
    keys[i].lo = ids[i];
  }
  CHECK_OK(kvo_pool_prepare_stores(p, keys, n, positions, slots, NULL, &st));
  for (i = 0; i < st.num_slots; ++i) {
    for (r = 0; r < 2; ++r) {
      unsigned char* c = NULL;
      CHECK_OK(kvo_pool_chunk(p, slots[i], r, (void**)&c));
      for (b = 0; b < 100; ++b) c[b] = byte_of(ids[positions[i]], r, b);
    }
  }
  CHECK_OK(kvo_pool_commit_stores(p, slots, st.num_slots));
  return st.num_slots;
}

/* Loads the ready prefix pinned, verifies every byte, unpins; returns the hits. */
static uint32_t load(kvo_pool_t* p, const uint64_t* ids, size_t n, uint32_t* cross) {
  kvo_block_key keys[8];
  uint32_t slots[8];
  kvo_pool_lookup lk;
  size_t i, b;
  uint32_t r;
  for (i = 0; i < n; ++i) {
    keys[i].hi = 0;
    keys[i].lo = ids[i];
  }
  CHECK_OK(kvo_pool_lookup_keys(p, keys, n, 1, slots, &lk));
  for (i = 0; i < lk.hits; ++i) {
    for (r = 0; r < 2; ++r) {
      unsigned char* c = NULL;
      CHECK_OK(kvo_pool_chunk(p, slots[i], r, (void**)&c));
      for (b = 0; b < 100; ++b) CHECK(c[b] == byte_of(ids[i], r, b));
    }
  }
  CHECK_OK(kvo_pool_unpin(p, slots, lk.hits));
  *cross = lk.cross_engine_hits;
  return lk.hits;
}

int main(void) {
  char dir[] = "/dev/shm/kvoffload-capi-pool-XXXXXX";
  kvo_pool_options o;
  kvo_pool_t *a = NULL, *b = NULL, *c = NULL;
  kvo_pool_stats st;
  uint32_t cross = 0, reclaimed = 0;
  const uint64_t first[] = {1, 2, 3};
  const uint64_t child[] = {7, 8};
  char path[320];
  pid_t pid;
  int status = 0;
  if (mkdtemp(dir) == NULL) FAIL("mkdtemp");
  (void)snprintf(path, sizeof path, "%s/kvoffload_cpool.pool", dir);

  options(&o, dir, "a");
  CHECK_OK(kvo_pool_attach(&o, &a));
  options(&o, dir, "b");
  CHECK_OK(kvo_pool_attach(&o, &b));
  CHECK(store(a, first, 3) == 3);
  CHECK(load(b, first, 3, &cross) == 3 && cross == 3);
  CHECK_OK(kvo_pool_stats_get(b, &st));
  CHECK(st.tenants == 2 && st.ready == 3 && st.cross_engine_hits == 3 && st.hits == 3);
  CHECK_OK(kvo_pool_check_invariants(a));

  /* Rank-major: each rank's slots are one range, the next rank's right after it. */
  {
    kvo_pool_rank_range r0, r1;
    void* chunk = NULL;
    const long page = sysconf(_SC_PAGESIZE);
    CHECK_OK(kvo_pool_rank_range_get(a, 0, &r0));
    CHECK_OK(kvo_pool_rank_range_get(a, 1, &r1));
    CHECK(r0.slot_stride == 256 && r1.slot_stride == 256); /* 100 bytes rounded up to 256 */
    CHECK(r0.bytes == r1.bytes && r0.bytes % (uint64_t)page == 0 && r0.bytes >= 4 * 256);
    CHECK(r0.file_offset % (uint64_t)page == 0 && r1.file_offset == r0.file_offset + r0.bytes);
    CHECK((char*)r1.data == (char*)r0.data + r0.bytes);
    {
      struct stat fst;
      CHECK(stat(path, &fst) == 0 && (uint64_t)fst.st_size == r1.file_offset + r1.bytes);
    }
    CHECK_OK(kvo_pool_chunk(a, 3, 1, &chunk));
    CHECK((char*)chunk == (char*)r1.data + 3 * r1.slot_stride);
    CHECK_ERR(kvo_pool_rank_range_get(a, 2, &r0), KVO_INVALID_ARGUMENT,
              "rank_range(2) is out of range: ranks 0..1");
  }

  /* A second process stores; the first loads its bytes. */
  (void)fflush(NULL);
  pid = fork();
  if (pid == 0) {
    kvo_pool_t* p = NULL;
    options(&o, dir, "child");
    if (kvo_pool_attach(&o, &p) != KVO_OK || store(p, child, 2) != 2) _exit(1);
    kvo_pool_close(p);
    _exit(0);
  }
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(load(a, child, 2, &cross) == 2 && cross == 2);
  CHECK_OK(kvo_pool_reclaim_dead_tenants(a, &reclaimed));
  CHECK(reclaimed == 0);

  /* Refusals. */
  options(&o, dir, "c");
  o.fingerprint = "other/ns";
  CHECK_ERR(kvo_pool_attach(&o, &c), KVO_MISMATCH,
            "fingerprint is 'model/ns' in the pool, 'other/ns'");
  CHECK(c == NULL);
  options(&o, dir, "c");
  o.policy = KVO_POLICY_ARC;
  CHECK_ERR(kvo_pool_attach(&o, &c), KVO_MISMATCH, "policy is 'lru' in the pool, 'arc'");
  options(&o, dir, "c");
  o.policy = (kvo_policy)7;
  CHECK_ERR(kvo_pool_attach(&o, &c), KVO_INVALID_ARGUMENT, "'options->policy' is 7");
  {
    kvo_pool_stats ps;
    CHECK_OK(kvo_pool_stats_get(a, &ps));
    CHECK(ps.policy == KVO_POLICY_LRU && ps.frequent == 0 && ps.ghost_recent == 0);
  }
  options(&o, dir, "a");
  CHECK_ERR(kvo_pool_attach(&o, &c), KVO_IN_USE, "already a tenant");
  options(&o, dir, "c");
  o.struct_size = 1;
  CHECK_ERR(kvo_pool_attach(&o, &c), KVO_INVALID_ARGUMENT, "struct_size 1");
  options(&o, dir, "c");
  o.name = NULL;
  CHECK_ERR(kvo_pool_attach(&o, &c), KVO_INVALID_ARGUMENT, "node pool name ''");
  CHECK_ERR(kvo_pool_commit_stores(a, NULL, 2), KVO_INVALID_ARGUMENT,
            "'slots' is NULL with count 2");
  {
    const uint32_t bad[] = {0};
    CHECK_ERR(kvo_pool_unpin(a, bad, 1), KVO_STATE, "this tenant pins it 0 times");
  }
  {
    void* ptr = NULL;
    CHECK_ERR(kvo_pool_chunk(a, 4, 0, &ptr), KVO_INVALID_ARGUMENT, "out of range");
  }

  kvo_pool_close(a);
  CHECK(access(path, F_OK) == 0);
  kvo_pool_close(b);
  CHECK(access(path, F_OK) != 0); /* the last tenant removed the pool */
  kvo_pool_close(NULL);
  (void)rmdir(dir);
  printf("capi_pool_test: %d checks passed\n", checks);
  return 0;
}
