/* (Over ~500 lines: one C program walks the whole C API in order, as an engine would.)
 * Exercises every function of kvoffload.h from C, error paths included. Exits non-zero on the
 * first failure with the file:line and the library's last error message. */
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

static char shm_dir[256];

static void test_errors_and_version(void) {
  /* Every status, written out by hand: the values are the stable ABI and the names are stable
   * too, so a renumbered, renamed, added or dropped code in error_codes.h fails here. */
  static const struct {
    kvo_status status;
    int value;
    const char* name;
  } codes[] = {
      {KVO_OK, 0, "ok"},
      {KVO_INVALID_ARGUMENT, 1, "invalid_argument"},
      {KVO_CAPACITY, 2, "capacity"},
      {KVO_SYSTEM, 3, "system"},
      {KVO_TIMEOUT, 4, "timeout"},
      {KVO_MISMATCH, 5, "mismatch"},
      {KVO_PERMISSION, 6, "permission"},
      {KVO_NOT_AVAILABLE, 7, "not_available"},
      {KVO_DEVICE, 8, "device"},
      {KVO_TRANSFER_FAILED, 9, "transfer_failed"},
      {KVO_NOT_FOUND, 10, "not_found"},
      {KVO_STATE, 11, "state"},
      {KVO_INTERNAL, 12, "internal"},
      {KVO_IN_USE, 13, "in_use"},
  };
  size_t i;
  CHECK(sizeof codes / sizeof codes[0] == KVOFFLOAD_ERROR_CODE_COUNT);
  for (i = 0; i < sizeof codes / sizeof codes[0]; ++i) {
    ++checks;
    if ((int)codes[i].status != codes[i].value)
      FAIL("%s is %d, expected %d", codes[i].name, (int)codes[i].status, codes[i].value);
    if (strcmp(kvo_status_name(codes[i].status), codes[i].name) != 0)
      FAIL("kvo_status_name(%d) is \"%s\", expected \"%s\"", codes[i].value,
           kvo_status_name(codes[i].status), codes[i].name);
  }
  CHECK(strcmp(kvo_status_name((kvo_status)14), "unknown") == 0);
  CHECK(strcmp(kvo_status_name((kvo_status)99), "unknown") == 0);
  CHECK(strcmp(kvo_status_name((kvo_status)-1), "unknown") == 0);
  CHECK(kvo_version() != NULL && strchr(kvo_version(), '.') != NULL);
  CHECK(kvo_last_error_message() != NULL);
  CHECK(kvo_last_error_call() != NULL);
}

static void region_options(kvo_region_options* o, const char* id, int32_t rank) {
  CHECK_OK(kvo_region_options_init(o));
  o->engine_id = id;
  o->num_chunks = 8;
  o->slot_bytes = 3000; /* not a page multiple: the row is padded */
  o->world_size = 2;
  o->rank = rank;
  o->shm_dir = shm_dir;
  o->join_timeout_ms = 5000;
}

static void test_region(void) {
  kvo_region_options o;
  kvo_region_t* creator = NULL;
  kvo_region_t* joiner = NULL;
  kvo_region_t* untouched = (kvo_region_t*)&o; /* must stay as is on error */
  kvo_region_geometry g;
  kvo_region_role role;
  kvo_populate_report rep;
  const char* path = NULL;
  const char* id = NULL;
  int32_t rank = 7;
  void* p0 = NULL;
  void* p1 = NULL;
  void* data = NULL;
  uint64_t bytes = 0;
  uint32_t removed = 99;

  /* Defaults. */
  CHECK_ERR(kvo_region_options_init(NULL), KVO_INVALID_ARGUMENT, "'options'");
  CHECK_OK(kvo_region_options_init(&o));
  CHECK(o.struct_size == sizeof o && o.world_size == 1 && o.rank == KVO_UNRANKED);
  CHECK(o.join_timeout_ms == 30000 && o.populate_threads == 1 && o.populate == 1);

  /* Argument errors name the argument and leave *out alone. */
  region_options(&o, "capi-region", 0);
  CHECK_ERR(kvo_region_create_or_join(NULL, &creator), KVO_INVALID_ARGUMENT, "'options'");
  CHECK_ERR(kvo_region_create_or_join(&o, NULL), KVO_INVALID_ARGUMENT, "'out'");
  CHECK(strstr(kvo_last_error_message(), "kvo_region_create_or_join") != NULL);
  o.struct_size = 3;
  CHECK_ERR(kvo_region_create_or_join(&o, &untouched), KVO_INVALID_ARGUMENT, "struct_size");
  CHECK(untouched == (kvo_region_t*)&o);
  region_options(&o, NULL, 0);
  CHECK_ERR(kvo_region_create_or_join(&o, &untouched), KVO_INVALID_ARGUMENT, "engine_id");
  region_options(&o, "bad/id", 0);
  CHECK_ERR(kvo_region_create_or_join(&o, &untouched), KVO_INVALID_ARGUMENT, "bad/id");
  region_options(&o, "capi-region", -5);
  CHECK_ERR(kvo_region_create_or_join(&o, &untouched), KVO_INVALID_ARGUMENT, "rank");
  region_options(&o, "capi-region", 0);
  o.num_chunks = 0;
  CHECK_ERR(kvo_region_create_or_join(&o, &untouched), KVO_INVALID_ARGUMENT,
            "num_chunks is 0; it must be at least 1");
  region_options(&o, "capi-region", 0);
  o.shm_dir = "/nonexistent/kvoffload-capi";
  CHECK(kvo_region_create_or_join(&o, &untouched) != KVO_OK);
  CHECK(strstr(kvo_last_error_message(), "/nonexistent/kvoffload-capi") != NULL);
  CHECK(untouched == (kvo_region_t*)&o);

  /* Create, then join from the same process as rank 1. */
  region_options(&o, "capi-region", 0);
  CHECK_OK(kvo_region_create_or_join(&o, &creator));
  region_options(&o, "capi-region", 1);
  CHECK_OK(kvo_region_create_or_join(&o, &joiner));
  CHECK_OK(kvo_region_role_get(creator, &role));
  CHECK(role == KVO_ROLE_CREATOR);
  CHECK_OK(kvo_region_role_get(joiner, &role));
  CHECK(role == KVO_ROLE_JOINER);

  /* Rank 0 has a holder (the creator, in this process): a second one is refused naming the
   * engine, the rank and the holder's PID, and *out stays untouched. */
  {
    char needle[64];
    (void)snprintf(needle, sizeof needle, "is held by PID %ld.", (long)getpid());
    region_options(&o, "capi-region", 0);
    CHECK_ERR(kvo_region_create_or_join(&o, &untouched), KVO_IN_USE, needle);
    CHECK(strstr(kvo_last_error_message(), "rank 0 of engine 'capi-region'") != NULL);
    CHECK(untouched == (kvo_region_t*)&o);
  }

  CHECK_OK(kvo_region_geometry_get(creator, &g));
  CHECK(g.num_chunks == 8 && g.slot_bytes == 3000 && g.world_size == 2 && g.copies == 2);
  CHECK(g.replicated == 0 && g.page_size > 0);
  CHECK(g.row_stride % g.page_size == 0 && g.row_stride >= 6000);
  CHECK(g.slot_align == 256 && g.slot_stride == 3072); /* 3000 rounded up to the default 256 */
  CHECK(g.data_bytes == 8 * g.row_stride);

  CHECK_OK(kvo_region_path(creator, &path));
  CHECK(strncmp(path, shm_dir, strlen(shm_dir)) == 0 && strstr(path, "capi-region") != NULL);
  CHECK(access(path, F_OK) == 0);
  CHECK_OK(kvo_region_engine_id(joiner, &id));
  CHECK(strcmp(id, "capi-region") == 0);
  CHECK_OK(kvo_region_rank(joiner, &rank));
  CHECK(rank == 1);
  CHECK_OK(kvo_region_populate_report_get(creator, &rep));
  CHECK(rep.method == KVO_POPULATE_MADVISE || rep.method == KVO_POPULATE_FALLBACK);
  CHECK(rep.seconds >= 0.0);

  /* Slots and rows: address arithmetic, and the two mappings share memory. */
  CHECK_OK(kvo_region_data(creator, &data, &bytes));
  CHECK(bytes == g.data_bytes && ((uintptr_t)data % g.page_size) == 0);
  CHECK_OK(kvo_region_slot(creator, 3, KVO_OWN_RANK, &p0, &bytes));
  CHECK(bytes == 3000 && (char*)p0 == (char*)data + 3 * g.row_stride);
  CHECK_OK(kvo_region_slot(creator, 3, 1, &p1, &bytes));
  CHECK((char*)p1 == (char*)data + 3 * g.row_stride + g.slot_stride); /* aligned: 3072 */
  memset(p1, 0x5a, 3000);
  CHECK_OK(kvo_region_slot(joiner, 3, KVO_OWN_RANK, &p1, &bytes));
  CHECK(((unsigned char*)p1)[0] == 0x5a && ((unsigned char*)p1)[2999] == 0x5a);
  CHECK_OK(kvo_region_row(joiner, 7, &p0, &bytes));
  CHECK(bytes == g.row_stride);

  CHECK_ERR(kvo_region_slot(creator, 8, KVO_OWN_RANK, &p0, &bytes), KVO_INVALID_ARGUMENT,
            "chunk 8 is out of range: the region has 8 chunks");
  CHECK_ERR(kvo_region_slot(creator, 0, 2, &p0, &bytes), KVO_INVALID_ARGUMENT,
            "rank 2 is out of range: world_size is 2");
  CHECK_ERR(kvo_region_slot(creator, 0, -2, &p0, &bytes), KVO_INVALID_ARGUMENT, "'rank'");
  CHECK_ERR(kvo_region_slot(creator, 0, 0, NULL, &bytes), KVO_INVALID_ARGUMENT, "'out_ptr'");
  CHECK_ERR(kvo_region_slot(creator, 0, 0, &p0, NULL), KVO_INVALID_ARGUMENT, "'out_bytes'");
  CHECK_ERR(kvo_region_row(creator, 9, &p0, &bytes), KVO_INVALID_ARGUMENT,
            "chunk 9 is out of range: the region has 8 chunks");
  CHECK_ERR(kvo_region_row(NULL, 0, &p0, &bytes), KVO_INVALID_ARGUMENT, "'region'");
  CHECK_ERR(kvo_region_data(creator, NULL, &bytes), KVO_INVALID_ARGUMENT, "'out_data'");
  CHECK_ERR(kvo_region_geometry_get(NULL, &g), KVO_INVALID_ARGUMENT, "'region'");
  CHECK_ERR(kvo_region_geometry_get(creator, NULL), KVO_INVALID_ARGUMENT, "'out'");
  CHECK_ERR(kvo_region_role_get(creator, NULL), KVO_INVALID_ARGUMENT, "'out'");
  CHECK_ERR(kvo_region_path(NULL, &path), KVO_INVALID_ARGUMENT, "'region'");
  CHECK_ERR(kvo_region_engine_id(creator, NULL), KVO_INVALID_ARGUMENT, "'out'");
  CHECK_ERR(kvo_region_rank(NULL, &rank), KVO_INVALID_ARGUMENT, "'region'");
  CHECK_ERR(kvo_region_populate_report_get(creator, NULL), KVO_INVALID_ARGUMENT, "'out'");

  /* A joiner with a different geometry is refused with both values named. */
  region_options(&o, "capi-region", 1);
  o.slot_bytes = 4096;
  CHECK(kvo_region_create_or_join(&o, &untouched) == KVO_MISMATCH);
  CHECK(strstr(kvo_last_error_message(), "4096") != NULL);

  /* An unranked mapper has no "own" slot. */
  region_options(&o, "capi-region", KVO_UNRANKED);
  CHECK_OK(kvo_region_create_or_join(&o, &untouched));
  CHECK_OK(kvo_region_rank(untouched, &rank));
  CHECK(rank == KVO_UNRANKED);
  CHECK_ERR(kvo_region_slot(untouched, 0, KVO_OWN_RANK, &p0, &bytes), KVO_STATE,
            "was mapped unranked");
  {
    /* One scheduler (unranked mapper) at a time. */
    kvo_region_t* second = (kvo_region_t*)&o;
    CHECK_ERR(kvo_region_create_or_join(&o, &second), KVO_IN_USE,
              "the scheduler role of engine 'capi-region'");
    CHECK(second == (kvo_region_t*)&o);
  }
  CHECK_OK(kvo_region_close(untouched));

  /* The region is in use: clean keeps it. The last one out removes the file. */
  CHECK_OK(kvo_region_clean(shm_dir, NULL, &removed));
  CHECK(removed == 0);
  CHECK_OK(kvo_region_clean(shm_dir, "capi-region", NULL));
  CHECK_ERR(kvo_region_clean(shm_dir, "bad/id", NULL), KVO_INVALID_ARGUMENT, "bad/id");
  CHECK(access(path, F_OK) == 0);
  {
    char saved[512];
    (void)snprintf(saved, sizeof saved, "%s", path);
    CHECK_OK(kvo_region_close(joiner));
    CHECK(access(saved, F_OK) == 0);
    CHECK_OK(kvo_region_close(creator));
    CHECK(access(saved, F_OK) != 0);
  }
  CHECK_OK(kvo_region_close(NULL));
}

static kvo_block_key key(uint64_t v) {
  kvo_block_key k;
  k.hi = 0;
  k.lo = v;
  return k;
}

static void test_manager(void) {
  kvo_manager_options o;
  kvo_manager_t* m = NULL;
  kvo_manager_t* untouched = NULL;
  kvo_block_key keys[4];
  kvo_block_key keys_out[4];
  kvo_block_key evicted[4];
  kvo_block_key parsed;
  uint32_t slots[4];
  uint32_t slot = 0;
  uint32_t pins = 9;
  kvo_lookup_result results[4];
  kvo_lookup_result state;
  kvo_store_plan plan;
  kvo_manager_stats st;
  const kvo_manager_event* events = NULL;
  size_t n_events = 0;
  size_t prefix = 99;
  char hex[33];
  int i;

  /* Keys in text form. */
  CHECK_OK(kvo_block_key_parse_hex("ff", &parsed));
  CHECK(parsed.hi == 0 && parsed.lo == 255);
  CHECK_OK(kvo_block_key_parse_hex("10000000000000002", &parsed));
  CHECK(parsed.hi == 1 && parsed.lo == 2);
  CHECK_OK(kvo_block_key_to_hex(parsed, hex, sizeof hex));
  CHECK(strcmp(hex, "00000000000000010000000000000002") == 0);
  CHECK_ERR(kvo_block_key_to_hex(parsed, hex, 32), KVO_INVALID_ARGUMENT, "out_size");
  CHECK_ERR(kvo_block_key_to_hex(parsed, NULL, 33), KVO_INVALID_ARGUMENT, "'out'");
  CHECK_ERR(kvo_block_key_parse_hex("xyz", &parsed), KVO_INVALID_ARGUMENT, "xyz");
  CHECK_ERR(kvo_block_key_parse_hex(NULL, &parsed), KVO_INVALID_ARGUMENT, "'text'");
  CHECK_ERR(kvo_block_key_parse_hex("1", NULL), KVO_INVALID_ARGUMENT, "'out'");

  /* Creation and its errors. */
  CHECK_ERR(kvo_manager_options_init(NULL), KVO_INVALID_ARGUMENT, "'options'");
  CHECK_OK(kvo_manager_options_init(&o));
  CHECK(o.struct_size == sizeof o && o.policy == KVO_POLICY_LRU && o.record_events == 1);
  CHECK_ERR(kvo_manager_create(&o, &untouched), KVO_INVALID_ARGUMENT, "num_chunks");
  CHECK(untouched == NULL);
  o.num_chunks = 2;
  o.policy = (kvo_policy)7;
  CHECK_ERR(kvo_manager_create(&o, &m), KVO_INVALID_ARGUMENT,
            "'options->policy' is 7; use KVO_POLICY_LRU or KVO_POLICY_ARC");
  o.policy = KVO_POLICY_ARC;
  o.struct_size = 1;
  CHECK_ERR(kvo_manager_create(&o, &m), KVO_INVALID_ARGUMENT, "struct_size");
  o.struct_size = sizeof o;
  CHECK_ERR(kvo_manager_create(NULL, &m), KVO_INVALID_ARGUMENT, "'options'");
  CHECK_ERR(kvo_manager_create(&o, NULL), KVO_INVALID_ARGUMENT, "'out'");
  CHECK_OK(kvo_manager_create(&o, &m));

  for (i = 0; i < 4; ++i) keys[i] = key(100 + (uint64_t)i);

  /* Miss, store, hit. */
  CHECK_OK(kvo_manager_lookup(m, keys, 2, results, &prefix));
  CHECK(prefix == 0 && results[0] == KVO_MISS && results[1] == KVO_MISS);
  CHECK_OK(kvo_manager_prepare_store(m, keys, 2, NULL, 0, keys_out, slots, evicted, &plan));
  CHECK(plan.ok && plan.num_keys == 2 && plan.num_evicted == 0 && plan.slots_needed == 2);
  CHECK(keys_out[0].lo == 100 && keys_out[1].lo == 101 && slots[0] != slots[1]);
  CHECK(slots[0] < 2 && slots[1] < 2);
  CHECK_OK(kvo_manager_lookup(m, keys, 2, results, NULL));
  CHECK(results[0] == KVO_HIT_PENDING);
  CHECK_ERR(kvo_manager_prepare_load(m, keys, 1, slots), KVO_STATE,
            "is write-pending; it can be loaded after complete_store");
  CHECK_OK(kvo_manager_complete_store(m, keys, 2, 1));
  CHECK_ERR(kvo_manager_complete_store(m, keys, 1, 1), KVO_STATE,
            "is already stored, not write-pending");
  CHECK_ERR(kvo_manager_complete_store(m, &keys[3], 1, 1), KVO_NOT_FOUND,
            "has no store pending (it is not in the manager)");
  CHECK_OK(kvo_manager_lookup(m, keys, 3, NULL, &prefix));
  CHECK(prefix == 2);
  CHECK_OK(kvo_manager_take_events(m, &events, &n_events));
  CHECK(n_events == 1 && events[0].kind == KVO_EVENT_STORED && events[0].num_keys == 2);
  CHECK(events[0].keys[0].lo == 100 && events[0].keys[1].lo == 101);
  CHECK_OK(kvo_manager_take_events(m, &events, &n_events));
  CHECK(n_events == 0);

  /* Load pins: a pinned chunk is not evicted, so a store of two new keys cannot fit. */
  CHECK_OK(kvo_manager_prepare_load(m, keys, 1, slots));
  CHECK_OK(kvo_manager_query(m, keys[0], &state, &slot, &pins));
  CHECK(state == KVO_HIT && slot == slots[0] && pins == 1);
  CHECK_OK(kvo_manager_prepare_store(m, &keys[2], 2, NULL, 0, keys_out, slots, evicted, &plan));
  CHECK(!plan.ok && plan.reason == KVO_STORE_REASON_NO_EVICTABLE_SPACE && plan.num_keys == 0);
  CHECK_ERR(kvo_manager_reset(m), KVO_STATE, "1 chunks pinned by loads; complete them first");
  CHECK_OK(kvo_manager_complete_load(m, keys, 1));
  CHECK_ERR(kvo_manager_complete_load(m, keys, 1), KVO_STATE,
            "is not pinned (no prepare_load pending)");
  CHECK_OK(kvo_manager_touch(m, keys, 2)); /* keys[1] is now least recent */

  /* Eviction under pressure, with a protected key. */
  CHECK_OK(kvo_manager_prepare_store(m, &keys[2], 1, keys, 1, keys_out, slots, evicted, &plan));
  CHECK(plan.ok && plan.num_keys == 1 && plan.num_evicted == 1 && evicted[0].lo == 101);
  CHECK_OK(kvo_manager_complete_store(m, &keys[2], 1, 0)); /* a failed store frees its slot */
  CHECK_OK(kvo_manager_query(m, keys[2], &state, &slot, NULL));
  CHECK(state == KVO_MISS && slot == KVO_NO_SLOT);
  CHECK_OK(kvo_manager_query(m, keys[0], NULL, NULL, NULL));
  /* evicted_out may be NULL: the eviction still shows as a removed event. */
  CHECK_OK(kvo_manager_prepare_store(m, &keys[3], 1, NULL, 0, keys_out, slots, NULL, &plan));
  CHECK(plan.ok && plan.num_evicted == 0);
  CHECK_OK(kvo_manager_complete_store(m, &keys[3], 1, 1));
  CHECK_OK(kvo_manager_take_events(m, &events, &n_events));
  CHECK(n_events == 2 && events[0].kind == KVO_EVENT_REMOVED && events[0].keys[0].lo == 101);
  CHECK(events[1].kind == KVO_EVENT_STORED && events[1].keys[0].lo == 103);

  CHECK_OK(kvo_manager_stats_get(m, &st));
  CHECK(st.num_chunks == 2 && st.used == 2 && st.evictions == 1 && st.stores_failed == 1);
  CHECK(st.hits == 2 && st.misses == 3 && st.loads_completed == 1 && st.allocation_failures == 1);
  CHECK(st.policy_resident == 2);
  CHECK_OK(kvo_manager_reset_stats(m));
  CHECK_OK(kvo_manager_stats_get(m, &st));
  CHECK(st.hits == 0 && st.used == 2);
  CHECK_OK(kvo_manager_reset(m));
  CHECK_OK(kvo_manager_stats_get(m, &st));
  CHECK(st.used == 0);

  /* Argument errors. */
  CHECK_ERR(kvo_manager_lookup(NULL, keys, 1, NULL, NULL), KVO_INVALID_ARGUMENT, "'manager'");
  CHECK_ERR(kvo_manager_lookup(m, NULL, 1, NULL, NULL), KVO_INVALID_ARGUMENT, "'keys'");
  CHECK_OK(kvo_manager_lookup(m, NULL, 0, NULL, &prefix));
  CHECK_ERR(kvo_manager_prepare_store(m, keys, 1, NULL, 0, NULL, slots, NULL, &plan),
            KVO_INVALID_ARGUMENT, "'keys_out'");
  CHECK_ERR(kvo_manager_prepare_store(m, keys, 1, NULL, 0, keys_out, NULL, NULL, &plan),
            KVO_INVALID_ARGUMENT, "'slots_out'");
  CHECK_ERR(kvo_manager_prepare_store(m, keys, 1, NULL, 0, keys_out, slots, NULL, NULL),
            KVO_INVALID_ARGUMENT, "'plan'");
  CHECK_ERR(kvo_manager_prepare_store(m, keys, 1, NULL, 2, keys_out, slots, NULL, &plan),
            KVO_INVALID_ARGUMENT, "'protected_keys'");
  CHECK_ERR(kvo_manager_prepare_load(m, keys, 1, NULL), KVO_INVALID_ARGUMENT, "'slots_out'");
  CHECK_ERR(kvo_manager_prepare_load(m, keys, 1, slots), KVO_NOT_FOUND,
            "is not stored (lookup first)");
  CHECK_ERR(kvo_manager_complete_load(m, NULL, 3), KVO_INVALID_ARGUMENT, "'keys'");
  CHECK_ERR(kvo_manager_touch(NULL, keys, 1), KVO_INVALID_ARGUMENT, "'manager'");
  CHECK_ERR(kvo_manager_reset(NULL), KVO_INVALID_ARGUMENT, "'manager'");
  CHECK_ERR(kvo_manager_query(NULL, keys[0], NULL, NULL, NULL), KVO_INVALID_ARGUMENT, "'manager'");
  CHECK_ERR(kvo_manager_take_events(m, NULL, &n_events), KVO_INVALID_ARGUMENT, "'out_events'");
  CHECK_ERR(kvo_manager_stats_get(m, NULL), KVO_INVALID_ARGUMENT, "'out'");
  CHECK_ERR(kvo_manager_reset_stats(NULL), KVO_INVALID_ARGUMENT, "'manager'");
  kvo_manager_destroy(m);
  kvo_manager_destroy(NULL);
}

/* Device layout of the transfer test: one group of two tensors of 8 blocks; page sizes differ
 * so that packing mistakes show. */
#define NBLOCKS 8
#define PAGE0 256
#define PAGE1 128
#define BPC 2

static unsigned char pattern(int tensor, int block, int i) {
  return (unsigned char)(tensor * 71 + block * 13 + i * 7 + 1);
}

static void test_runtime_and_engine(void) {
  kvo_runtime_t* rt = NULL;
  kvo_runtime_t* untouched = NULL;
  kvo_region_options ro;
  kvo_region_t* region = NULL;
  kvo_engine_options eo;
  kvo_engine_t* engine = NULL;
  kvo_engine_t* buffer_engine = NULL;
  kvo_registration_t* reg = NULL;
  kvo_device_tensor tensors[2];
  kvo_kv_group group;
  kvo_host_slots host;
  kvo_transfer_spec spec;
  kvo_block_list blocks;
  kvo_wait_on wait_on;
  kvo_wait_on no_wait;
  kvo_job_result results[4];
  kvo_engine_stats es;
  const char* name = NULL;
  uint64_t dev[2] = {0, 0};
  uint64_t stream = 0, event = 0, dptr = 0, scratch = 0;
  uint64_t chunks[2] = {1, 2};
  uint64_t store_blocks[4] = {0, 1, 2, 3};
  uint64_t load_blocks[4] = {4, 5, 6, 7};
  uint64_t ids[2];
  unsigned char* slot_bytes = NULL;
  void* slot = NULL;
  uint64_t bytes = 0;
  size_t n = 0;
  int done = 0, kernel = -1, t, b, i;
  kvo_status s;

  /* Runtimes by name. */
  CHECK_ERR(kvo_runtime_create("bogus", 0, &untouched), KVO_INVALID_ARGUMENT, "bogus");
  CHECK(untouched == NULL);
  CHECK_ERR(kvo_runtime_create(NULL, 0, &rt), KVO_INVALID_ARGUMENT, "'backend'");
  CHECK_ERR(kvo_runtime_create("host", 0, NULL), KVO_INVALID_ARGUMENT, "'out'");
  CHECK_ERR(kvo_runtime_create("host", -1, &rt), KVO_INVALID_ARGUMENT, "'device'");
  s = kvo_runtime_create("cuda", 0, &untouched);
  CHECK(s == KVO_OK || s == KVO_NOT_AVAILABLE);
  if (s == KVO_OK)
    kvo_runtime_destroy(untouched);
  else
    CHECK(strstr(kvo_last_error_message(), "cuda") != NULL);
  CHECK_OK(kvo_runtime_create("host", 0, &rt));
  CHECK_OK(kvo_runtime_name(rt, &name));
  CHECK(strcmp(name, "host") == 0);
  CHECK_OK(kvo_runtime_supports_kernel_path(rt, &kernel));
  CHECK(kernel == 0 || kernel == 1);
  CHECK_ERR(kvo_runtime_name(NULL, &name), KVO_INVALID_ARGUMENT, "'runtime'");
  CHECK_ERR(kvo_runtime_supports_kernel_path(rt, NULL), KVO_INVALID_ARGUMENT, "'out'");

  /* Streams, events, device memory, synchronous copies. */
  CHECK_OK(kvo_runtime_stream_create(rt, &stream));
  CHECK(stream != 0);
  CHECK_OK(kvo_runtime_event_create(rt, &event));
  CHECK(event != 0);
  CHECK_OK(kvo_runtime_device_alloc(rt, NBLOCKS * PAGE0, &dev[0]));
  CHECK_OK(kvo_runtime_device_alloc(rt, NBLOCKS * PAGE1, &dev[1]));
  CHECK_OK(kvo_runtime_device_alloc(rt, 64, &scratch));
  CHECK_OK(kvo_runtime_memset(rt, scratch, 0x33, 64));
  {
    unsigned char back[64];
    CHECK_OK(kvo_runtime_memcpy(rt, (uint64_t)(uintptr_t)back, scratch, 64));
    CHECK(back[0] == 0x33 && back[63] == 0x33);
  }
  CHECK_OK(kvo_runtime_device_free(rt, scratch));
  CHECK_ERR(kvo_runtime_device_free(rt, scratch), KVO_NOT_FOUND, "kvo_runtime_device_alloc");
  CHECK_ERR(kvo_runtime_device_alloc(rt, 0, &scratch), KVO_INVALID_ARGUMENT, "'bytes'");
  CHECK_ERR(kvo_runtime_device_alloc(rt, 64, NULL), KVO_INVALID_ARGUMENT, "'out_ptr'");
  CHECK_ERR(kvo_runtime_memcpy(rt, 0, dev[0], 8), KVO_INVALID_ARGUMENT, "'dst'");
  CHECK_ERR(kvo_runtime_memcpy(rt, dev[0], 0, 8), KVO_INVALID_ARGUMENT, "'src'");
  CHECK_ERR(kvo_runtime_memset(rt, 0, 0, 8), KVO_INVALID_ARGUMENT, "'dst'");
  for (t = 0; t < 2; ++t) {
    int page = t == 0 ? PAGE0 : PAGE1;
    for (b = 0; b < NBLOCKS; ++b)
      for (i = 0; i < page; ++i)
        ((unsigned char*)(uintptr_t)dev[t])[b * page + i] = pattern(t, b, i);
  }

  /* Registration of host memory. */
  {
    static unsigned char host_mem[8192];
    uint64_t dp = 0;
    CHECK_ERR(kvo_runtime_register_host(rt, NULL, 4096, 0, &reg), KVO_INVALID_ARGUMENT, "'ptr'");
    CHECK_ERR(kvo_runtime_register_host(rt, host_mem, 0, 0, &reg), KVO_INVALID_ARGUMENT, "'bytes'");
    CHECK_OK(kvo_runtime_register_host(rt, host_mem, sizeof host_mem, 0, &reg));
    CHECK_OK(kvo_registration_device_pointer(reg, host_mem + 100, &dp));
    CHECK(dp != 0);
    CHECK_ERR(kvo_registration_device_pointer(reg, (const unsigned char*)&dp, &dp),
              KVO_INVALID_ARGUMENT, "pointer is outside the registered range");
    CHECK_ERR(kvo_registration_device_pointer(NULL, host_mem, &dp), KVO_INVALID_ARGUMENT,
              "'registration'");
    CHECK_OK(kvo_registration_destroy(reg));
    CHECK_OK(kvo_registration_destroy(NULL));
  }

  /* The region of rank 0, and an engine over it. */
  CHECK_OK(kvo_region_options_init(&ro));
  ro.engine_id = "capi-engine";
  ro.num_chunks = 4;
  ro.slot_bytes = BPC * (PAGE0 + PAGE1);
  ro.world_size = 1;
  ro.rank = 0;
  ro.shm_dir = shm_dir;
  CHECK_OK(kvo_region_create_or_join(&ro, &region));

  tensors[0].base = dev[0];
  tensors[0].num_blocks = NBLOCKS;
  tensors[0].page_bytes = PAGE0;
  tensors[0].block_stride = 0;
  tensors[1].base = dev[1];
  tensors[1].num_blocks = NBLOCKS;
  tensors[1].page_bytes = PAGE1;
  tensors[1].block_stride = PAGE1;
  group.tensors = tensors;
  group.num_tensors = 2;

  CHECK_ERR(kvo_engine_options_init(NULL), KVO_INVALID_ARGUMENT, "'options'");
  CHECK_OK(kvo_engine_options_init(&eo));
  CHECK(eo.struct_size == sizeof eo && eo.register_host == 1 && eo.store_kernel_below_bytes > 0);
  eo.struct_size = 0;
  CHECK_ERR(kvo_engine_create_for_region(rt, region, 0, &group, 1, BPC, &eo, &engine),
            KVO_INVALID_ARGUMENT, "struct_size");
  CHECK_OK(kvo_engine_options_init(&eo));
  CHECK_ERR(kvo_engine_create_for_region(rt, region, 0, &group, 0, BPC, &eo, &engine),
            KVO_INVALID_ARGUMENT, "'num_groups'");
  CHECK_ERR(kvo_engine_create_for_region(rt, region, 0, NULL, 1, BPC, &eo, &engine),
            KVO_INVALID_ARGUMENT, "'groups'");
  CHECK_ERR(kvo_engine_create_for_region(NULL, region, 0, &group, 1, BPC, &eo, &engine),
            KVO_INVALID_ARGUMENT, "'runtime'");
  CHECK_ERR(kvo_engine_create_for_region(rt, NULL, 0, &group, 1, BPC, &eo, &engine),
            KVO_INVALID_ARGUMENT, "'region'");
  /* A slot too small for the layout is refused by the layout validation. */
  CHECK(kvo_engine_create_for_region(rt, region, 0, &group, 1, BPC + 1, &eo, &engine) ==
        KVO_INVALID_ARGUMENT);
  CHECK(engine == NULL);
  CHECK_OK(kvo_engine_create_for_region(rt, region, 0, &group, 1, BPC, NULL, &engine));

  /* Store blocks 0..3 into chunks 1, 2 after the "compute" stream. */
  blocks.blocks = store_blocks;
  blocks.count = 4;
  spec.chunks = chunks;
  spec.num_chunks = 2;
  spec.skip = 0;
  spec.groups = &blocks;
  spec.num_groups = 1;
  wait_on.kind = KVO_WAIT_STREAM;
  wait_on.handle = stream;
  no_wait.kind = KVO_WAIT_NOTHING;
  no_wait.handle = 0;
  CHECK_OK(kvo_engine_submit(engine, 1, KVO_STORE, &spec, wait_on));
  CHECK_ERR(kvo_engine_submit(engine, 1, KVO_STORE, &spec, wait_on), KVO_INVALID_ARGUMENT,
            "duplicate job id 1");
  ids[0] = 1;
  CHECK_OK(kvo_engine_wait(engine, ids, 1, results));
  CHECK(results[0].job_id == 1 && results[0].success && results[0].direction == KVO_STORE);
  CHECK(results[0].bytes == 4 * (PAGE0 + PAGE1) && results[0].error[0] == '\0');

  /* The host slot holds tensor 0's two pages, then tensor 1's. */
  CHECK_OK(kvo_region_slot(region, 2, KVO_OWN_RANK, &slot, &bytes));
  slot_bytes = (unsigned char*)slot;
  CHECK(slot_bytes[0] == pattern(0, 2, 0) && slot_bytes[PAGE0 + 5] == pattern(0, 3, 5));
  CHECK(slot_bytes[2 * PAGE0] == pattern(1, 2, 0) &&
        slot_bytes[2 * PAGE0 + PAGE1 + 9] == pattern(1, 3, 9));

  /* Load them back into blocks 4..7 and compare. */
  blocks.blocks = load_blocks;
  CHECK_OK(kvo_runtime_event_record(rt, event, stream));
  wait_on.kind = KVO_WAIT_EVENT;
  wait_on.handle = event;
  CHECK_OK(kvo_engine_submit(engine, 2, KVO_LOAD, &spec, wait_on));
  CHECK_OK(kvo_engine_submit(engine, 3, KVO_LOAD, &spec, no_wait));
  ids[0] = 3;
  ids[1] = 2;
  CHECK_OK(kvo_engine_wait(engine, ids, 2, results));
  CHECK(results[0].job_id == 3 && results[1].job_id == 2 && results[0].success &&
        results[1].success);
  for (t = 0; t < 2; ++t) {
    int page = t == 0 ? PAGE0 : PAGE1;
    for (b = 0; b < 4; ++b)
      CHECK(memcmp((unsigned char*)(uintptr_t)dev[t] + (4 + b) * page,
                   (unsigned char*)(uintptr_t)dev[t] + b * page, (size_t)page) == 0);
  }

  /* poll with less room than results: the rest wait for the next call; wait finds them too. */
  CHECK_OK(kvo_engine_submit(engine, 4, KVO_STORE, &spec, no_wait));
  CHECK_OK(kvo_engine_submit(engine, 5, KVO_STORE, &spec, no_wait));
  CHECK_OK(kvo_engine_submit(engine, 6, KVO_STORE, &spec, no_wait));
  CHECK_OK(kvo_engine_wait_all(engine, results, 1, &n));
  CHECK(n == 1 && results[0].job_id == 4);
  ids[0] = 6;
  CHECK_OK(kvo_engine_wait(engine, ids, 1, results));
  CHECK(results[0].job_id == 6 && results[0].success);
  CHECK_OK(kvo_engine_poll(engine, results, 4, &n));
  CHECK(n == 1 && results[0].job_id == 5);
  CHECK_OK(kvo_engine_poll(engine, results, 4, &n));
  CHECK(n == 0);
  CHECK_OK(kvo_engine_poll(engine, NULL, 0, &n));

  /* Submission and wait errors. */
  CHECK_ERR(kvo_engine_wait(engine, ids, 1, results), KVO_NOT_FOUND, "job 6 is not pending");
  chunks[1] = 4; /* out of range */
  CHECK_ERR(kvo_engine_submit(engine, 7, KVO_STORE, &spec, no_wait), KVO_INVALID_ARGUMENT,
            "host chunk id 4 (index 1) is out of range");
  chunks[1] = 2;
  CHECK_ERR(kvo_engine_submit(engine, 7, (kvo_direction)5, &spec, no_wait), KVO_INVALID_ARGUMENT,
            "'direction'");
  CHECK_ERR(kvo_engine_submit(engine, 7, KVO_STORE, NULL, no_wait), KVO_INVALID_ARGUMENT, "'spec'");
  spec.chunks = NULL;
  CHECK_ERR(kvo_engine_submit(engine, 7, KVO_STORE, &spec, no_wait), KVO_INVALID_ARGUMENT,
            "spec->chunks");
  spec.chunks = chunks;
  spec.groups = NULL;
  CHECK_ERR(kvo_engine_submit(engine, 7, KVO_STORE, &spec, no_wait), KVO_INVALID_ARGUMENT,
            "'spec->groups' is NULL with num_groups 1");
  spec.groups = &blocks;
  blocks.blocks = NULL;
  CHECK_ERR(kvo_engine_submit(engine, 7, KVO_STORE, &spec, no_wait), KVO_INVALID_ARGUMENT,
            "spec->groups[0].blocks");
  blocks.blocks = store_blocks;
  wait_on.kind = KVO_WAIT_EVENT;
  wait_on.handle = 0;
  CHECK_ERR(kvo_engine_submit(engine, 7, KVO_STORE, &spec, wait_on), KVO_INVALID_ARGUMENT,
            "wait_on.handle");
  wait_on.kind = (kvo_wait_kind)9;
  CHECK_ERR(kvo_engine_submit(engine, 7, KVO_STORE, &spec, wait_on), KVO_INVALID_ARGUMENT,
            "wait_on.kind");
  CHECK_ERR(kvo_engine_poll(engine, NULL, 2, &n), KVO_INVALID_ARGUMENT, "'out'");
  CHECK_ERR(kvo_engine_poll(engine, results, 2, NULL), KVO_INVALID_ARGUMENT, "'out_count'");
  CHECK_ERR(kvo_engine_wait(engine, NULL, 1, results), KVO_INVALID_ARGUMENT, "'job_ids'");
  CHECK_ERR(kvo_engine_wait_all(NULL, results, 1, &n), KVO_INVALID_ARGUMENT, "'engine'");
  CHECK_ERR(kvo_engine_stats_get(engine, NULL), KVO_INVALID_ARGUMENT, "'out'");

  CHECK_OK(kvo_engine_stats_get(engine, &es));
  CHECK(es.jobs_submitted == 6 && es.jobs_succeeded == 6 && es.jobs_failed == 0);
  CHECK(es.bytes_succeeded == 6 * 4 * (PAGE0 + PAGE1) && es.descriptors > 0);

  CHECK_OK(kvo_engine_shutdown(engine));
  CHECK_ERR(kvo_engine_submit(engine, 8, KVO_STORE, &spec, no_wait), KVO_STATE,
            "submit after shutdown");
  CHECK_OK(kvo_engine_shutdown(engine));
  CHECK_ERR(kvo_engine_shutdown(NULL), KVO_INVALID_ARGUMENT, "'engine'");
  kvo_engine_destroy(engine);
  kvo_engine_destroy(NULL);

  /* An engine over a plain host buffer (row_stride = slot_bytes), no registration. */
  {
    static unsigned char buffer[4 * BPC * (PAGE0 + PAGE1)];
    host.base = buffer;
    host.buffer_bytes = sizeof buffer;
    host.num_chunks = 4;
    host.row_stride = BPC * (PAGE0 + PAGE1);
    host.slot_offset = 0;
    host.slot_bytes = BPC * (PAGE0 + PAGE1);
    eo.register_host = 0;
    CHECK_ERR(kvo_engine_create(rt, NULL, &group, 1, BPC, &eo, &buffer_engine),
              KVO_INVALID_ARGUMENT, "'host'");
    host.base = NULL;
    CHECK_ERR(kvo_engine_create(rt, &host, &group, 1, BPC, &eo, &buffer_engine),
              KVO_INVALID_ARGUMENT, "host->base");
    host.base = buffer;
    CHECK_OK(kvo_engine_create(rt, &host, &group, 1, BPC, &eo, &buffer_engine));
    CHECK_OK(kvo_engine_stats_get(buffer_engine, &es));
    CHECK(es.host_registered == 0);
    CHECK_OK(kvo_engine_submit(buffer_engine, 1, KVO_STORE, &spec, no_wait));
    CHECK_OK(kvo_engine_wait_all(buffer_engine, results, 4, &n));
    CHECK(n == 1 && results[0].success);
    CHECK(buffer[1 * host.row_stride] == pattern(0, 0, 0));
    kvo_engine_destroy(buffer_engine);
  }

  CHECK_OK(kvo_region_close(region));
  CHECK_OK(kvo_runtime_event_query(rt, event, &done));
  CHECK(done == 1);
  CHECK_OK(kvo_runtime_event_synchronize(rt, event));
  CHECK_OK(kvo_runtime_stream_synchronize(rt, stream));
  CHECK_ERR(kvo_runtime_event_record(rt, 0, stream), KVO_INVALID_ARGUMENT, "'event'");
  CHECK_ERR(kvo_runtime_event_query(rt, event, NULL), KVO_INVALID_ARGUMENT, "'out_done'");
  CHECK_ERR(kvo_runtime_stream_create(rt, NULL), KVO_INVALID_ARGUMENT, "'out_stream'");
  CHECK_ERR(kvo_runtime_event_create(NULL, &dptr), KVO_INVALID_ARGUMENT, "'runtime'");
  CHECK_OK(kvo_runtime_event_destroy(rt, event));
  CHECK_ERR(kvo_runtime_event_destroy(rt, event), KVO_NOT_FOUND,
            "was not made by kvo_runtime_event_create on this runtime");
  CHECK_OK(kvo_runtime_stream_destroy(rt, stream));
  CHECK_ERR(kvo_runtime_stream_destroy(rt, stream), KVO_NOT_FOUND,
            "was not made by kvo_runtime_stream_create on this runtime");
  /* Device buffers still allocated are released with the runtime. */
  kvo_runtime_destroy(rt);
  kvo_runtime_destroy(NULL);
}

/* A job that fails is reported failed: success 0, the reason in `error`, counted in jobs_failed,
 * through wait and through poll. On the simulated device, a copy from device memory that was freed
 * under the engine (an engine that released its KV cache too early) is an invalid DMA, as
 * cudaMemcpy refuses it: the job fails at submission and completes failed. */
static void test_failed_job(void) {
  kvo_runtime_t* rt = NULL;
  kvo_region_options ro;
  kvo_region_t* region = NULL;
  kvo_engine_t* engine = NULL;
  kvo_engine_options eo;
  kvo_device_tensor tensor;
  kvo_kv_group group;
  kvo_transfer_spec spec;
  kvo_block_list blocks;
  kvo_wait_on no_wait;
  kvo_job_result results[2];
  kvo_engine_stats es;
  uint64_t dev = 0;
  uint64_t chunk = 1;
  uint64_t block_ids[BPC] = {0, 1};
  uint64_t id = 0;
  size_t n = 0;

  CHECK_OK(kvo_runtime_create("sim", 0, &rt));
  CHECK_OK(kvo_runtime_device_alloc(rt, 2 * PAGE0, &dev));
  CHECK_OK(kvo_runtime_memset(rt, dev, 0x42, 2 * PAGE0));
  tensor.base = dev;
  tensor.num_blocks = 2;
  tensor.page_bytes = PAGE0;
  tensor.block_stride = 0;
  group.tensors = &tensor;
  group.num_tensors = 1;
  CHECK_OK(kvo_region_options_init(&ro));
  ro.engine_id = "capi-failed-job";
  ro.num_chunks = 4;
  ro.slot_bytes = BPC * PAGE0;
  ro.world_size = 1;
  ro.rank = 0;
  ro.shm_dir = shm_dir;
  CHECK_OK(kvo_region_create_or_join(&ro, &region));
  CHECK_OK(kvo_engine_options_init(&eo));
  eo.allow_kernel = 0; /* DMA: the failure is the copy's own, at submission */
  CHECK_OK(kvo_engine_create_for_region(rt, region, 0, &group, 1, BPC, &eo, &engine));

  spec.chunks = &chunk;
  spec.num_chunks = 1;
  spec.skip = 0;
  spec.groups = &blocks;
  spec.num_groups = 1;
  blocks.blocks = block_ids;
  blocks.count = BPC;
  no_wait.kind = KVO_WAIT_NOTHING;
  no_wait.handle = 0;

  /* A good job first: the runtime and the layout work. */
  CHECK_OK(kvo_engine_submit(engine, 1, KVO_STORE, &spec, no_wait));
  id = 1;
  CHECK_OK(kvo_engine_wait(engine, &id, 1, results));
  CHECK(results[0].job_id == 1 && results[0].success == 1 && results[0].error[0] == '\0');

  /* The KV cache is freed under the engine; the next store fails, collected by wait. */
  CHECK_OK(kvo_runtime_device_free(rt, dev));
  CHECK_OK(kvo_engine_submit(engine, 2, KVO_STORE, &spec, no_wait));
  id = 2;
  CHECK_OK(kvo_engine_wait(engine, &id, 1, results));
  CHECK(results[0].job_id == 2 && results[0].direction == KVO_STORE);
  CHECK(results[0].success == 0);
  CHECK(results[0].error != NULL && strstr(results[0].error, "memcpy_async") != NULL);

  /* And one collected by poll (after wait_all has gathered it). */
  CHECK_OK(kvo_engine_submit(engine, 3, KVO_STORE, &spec, no_wait));
  CHECK_OK(kvo_engine_wait_all(engine, results, 0, &n));
  CHECK(n == 0);
  CHECK_OK(kvo_engine_poll(engine, results, 2, &n));
  CHECK(n == 1 && results[0].job_id == 3 && results[0].success == 0);
  CHECK(results[0].error[0] != '\0');

  CHECK_OK(kvo_engine_stats_get(engine, &es));
  CHECK(es.jobs_submitted == 3 && es.jobs_succeeded == 1 && es.jobs_failed == 2);
  kvo_engine_destroy(engine);
  CHECK_OK(kvo_region_close(region));
  kvo_runtime_destroy(rt);
}

/* Issue 25 (8): kvo_engine_options.job_timing. By default a job's copies are timed (seconds > 0
 * on the simulated device, whose timing events carry the copies' completion times); with
 * job_timing 0 no timing event is recorded and seconds is exactly 0, the copies still exact. */
static void test_job_timing(void) {
  kvo_runtime_t* rt = NULL;
  kvo_region_options ro;
  kvo_region_t* region = NULL;
  kvo_engine_t* engine = NULL;
  kvo_engine_options eo;
  kvo_device_tensor tensor;
  kvo_kv_group group;
  kvo_transfer_spec spec;
  kvo_block_list blocks;
  kvo_wait_on no_wait;
  kvo_job_result result;
  uint64_t dev = 0;
  uint64_t chunk = 1;
  uint64_t block_ids[BPC] = {0, 1};
  uint64_t id = 0;
  void* slot = NULL;
  uint64_t bytes = 0;
  int timing;

  CHECK_OK(kvo_runtime_create("sim", 0, &rt));
  CHECK_OK(kvo_runtime_device_alloc(rt, 2 * PAGE0, &dev));
  tensor.base = dev;
  tensor.num_blocks = 2;
  tensor.page_bytes = PAGE0;
  tensor.block_stride = 0;
  group.tensors = &tensor;
  group.num_tensors = 1;
  CHECK_OK(kvo_region_options_init(&ro));
  ro.engine_id = "capi-job-timing";
  ro.num_chunks = 4;
  ro.slot_bytes = BPC * PAGE0;
  ro.world_size = 1;
  ro.rank = 0;
  ro.shm_dir = shm_dir;
  CHECK_OK(kvo_region_create_or_join(&ro, &region));
  CHECK_OK(kvo_engine_options_init(&eo));
  CHECK(eo.job_timing == 1);
  spec.chunks = &chunk;
  spec.num_chunks = 1;
  spec.skip = 0;
  spec.groups = &blocks;
  spec.num_groups = 1;
  blocks.blocks = block_ids;
  blocks.count = BPC;
  no_wait.kind = KVO_WAIT_NOTHING;
  no_wait.handle = 0;
  CHECK_OK(kvo_region_slot(region, chunk, KVO_OWN_RANK, &slot, &bytes));
  for (timing = 1; timing >= 0; --timing) {
    CHECK_OK(kvo_engine_options_init(&eo));
    eo.allow_kernel = 0;
    eo.job_timing = timing;
    CHECK_OK(kvo_runtime_memset(rt, dev, 0x30 + timing, 2 * PAGE0));
    CHECK_OK(kvo_engine_create_for_region(rt, region, 0, &group, 1, BPC, &eo, &engine));
    id = 1;
    CHECK_OK(kvo_engine_submit(engine, id, KVO_STORE, &spec, no_wait));
    CHECK_OK(kvo_engine_wait(engine, &id, 1, &result));
    CHECK(result.success == 1 && result.bytes == 2 * PAGE0);
    if (timing)
      CHECK(result.seconds > 0.0);
    else
      CHECK(result.seconds == 0.0);
    CHECK(((unsigned char*)slot)[0] == 0x30 + timing &&
          ((unsigned char*)slot)[2 * PAGE0 - 1] == 0x30 + timing);
    kvo_engine_destroy(engine);
    engine = NULL;
  }
  CHECK_OK(kvo_runtime_device_free(rt, dev));
  CHECK_OK(kvo_region_close(region));
  kvo_runtime_destroy(rt);
}

int main(void) {
  char tmpl[] = "/tmp/kvoffload-capi-XXXXXX";
  char cmd[300];
  if (mkdtemp(tmpl) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  (void)snprintf(shm_dir, sizeof shm_dir, "%s", tmpl);

  test_errors_and_version();
  test_region();
  test_manager();
  test_runtime_and_engine();
  test_failed_job();
  test_job_timing();

  (void)snprintf(cmd, sizeof cmd, "rm -rf '%s'", shm_dir);
  if (system(cmd) != 0) (void)fprintf(stderr, "warning: could not remove %s\n", shm_dir);
  (void)printf("capi_test: %d checks passed\n", checks);
  return 0;
}
