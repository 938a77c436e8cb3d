/* The engine integration through the C API (kvoffload.h): create the region for rank 0, build the
 * runtime and engine, store 4 GPU blocks after the compute stream, load them back into other
 * blocks, verify, shut down. Every call's status is checked; the message says what failed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvoffload/kvoffload.h>

#define TRY(call)                                                         \
  do {                                                                    \
    kvo_status s_ = (call);                                               \
    if (s_ != KVO_OK) {                                                   \
      fprintf(stderr, "%s failed: [%s] %s\n", #call, kvo_status_name(s_), \
              kvo_last_error_message());                                  \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

enum { BLOCKS = 16, PAGE = 4096, BPC = 2 };

int main(int argc, char** argv) {
  const char* shm_dir = argc > 1 ? argv[1] : NULL;
  kvo_runtime_t* rt;
  kvo_region_t* region;
  kvo_engine_t* engine;
  kvo_region_options ro;
  kvo_device_tensor kv[2];
  kvo_kv_group group;
  uint64_t dev[2], stream, chunks[2] = {0, 1};
  uint64_t store[4] = {0, 1, 2, 3}, load[4] = {8, 9, 10, 11}, ids[1] = {2};
  kvo_block_list blocks;
  kvo_transfer_spec spec;
  kvo_wait_on after_compute;
  kvo_job_result result;
  size_t n = 0;
  const char* name;
  unsigned char host[PAGE], back[PAGE];
  int t, b;

  TRY(kvo_runtime_create("auto", 0, &rt));
  TRY(kvo_runtime_name(rt, &name));
  TRY(kvo_runtime_stream_create(rt, &stream));
  for (t = 0; t < 2; ++t) { /* a K and a V tensor */
    TRY(kvo_runtime_device_alloc(rt, (uint64_t)BLOCKS * PAGE, &dev[t]));
    for (b = 0; b < BLOCKS; ++b) {
      memset(host, t * 16 + b, PAGE);
      TRY(kvo_runtime_memcpy(rt, dev[t] + (uint64_t)b * PAGE, (uint64_t)(uintptr_t)host, PAGE));
    }
    kv[t].base = dev[t];
    kv[t].num_blocks = BLOCKS;
    kv[t].page_bytes = PAGE;
    kv[t].block_stride = PAGE;
  }
  group.tensors = kv;
  group.num_tensors = 2;

  TRY(kvo_region_options_init(&ro));
  ro.engine_id = "example-engine-c";
  ro.num_chunks = 4;
  ro.slot_bytes = BPC * 2 * PAGE;
  ro.rank = 0;
  ro.shm_dir = shm_dir;
  TRY(kvo_region_create_or_join(&ro, &region));
  TRY(kvo_engine_create_for_region(rt, region, 0, &group, 1, BPC, NULL, &engine));

  blocks.blocks = store;
  blocks.count = 4;
  spec.chunks = chunks;
  spec.num_chunks = 2;
  spec.skip = 0;
  spec.groups = &blocks;
  spec.num_groups = 1;
  after_compute.kind = KVO_WAIT_STREAM;
  after_compute.handle = stream;
  TRY(kvo_engine_submit(engine, 1, KVO_STORE, &spec, after_compute));
  while (n == 0) TRY(kvo_engine_poll(engine, &result, 1, &n)); /* once per engine step */
  if (!result.success) {
    fprintf(stderr, "store failed: %s\n", result.error);
    return 1;
  }
  blocks.blocks = load;
  TRY(kvo_engine_submit(engine, 2, KVO_LOAD, &spec, after_compute));
  TRY(kvo_engine_wait(engine, ids, 1, &result));
  if (!result.success) {
    fprintf(stderr, "load failed: %s\n", result.error);
    return 1;
  }
  for (t = 0; t < 2; ++t) {
    for (b = 0; b < 4; ++b) {
      TRY(kvo_runtime_memcpy(rt, (uint64_t)(uintptr_t)back, dev[t] + (uint64_t)(8 + b) * PAGE,
                             PAGE));
      memset(host, t * 16 + b, PAGE);
      if (memcmp(back, host, PAGE) != 0) {
        fprintf(stderr, "block %d of tensor %d came back wrong\n", 8 + b, t);
        return 1;
      }
    }
  }
  printf("C example (%s backend): stored and loaded %llu bytes, all bytes verified\n", name,
         (unsigned long long)result.bytes);

  kvo_engine_destroy(engine);
  TRY(kvo_region_close(region));
  kvo_runtime_destroy(rt);
  return 0;
}
