/* The remote tier configuration through the C API (plain C99): defaults, validation messages,
 * the URL's kind and nodes, and the geometry fingerprint. */
#include <stdio.h>
#include <string.h>

#include <kvoffload/kvoffload.h>

static int failures = 0;
#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              kvo_last_error_message());                                                       \
      ++failures;                                                                              \
    }                                                                                          \
  } while (0)

static int mentions(const char* needle) {
  return strstr(kvo_last_error_message(), needle) != NULL;
}

int main(void) {
  kvo_remote_tier_options o;
  kvo_remote_kind kind;
  size_t nodes = 0;
  uint64_t fp1 = 0, fp2 = 0;

  CHECK(kvo_remote_tier_options_init(NULL) == KVO_INVALID_ARGUMENT);
  CHECK(kvo_remote_tier_options_init(&o) == KVO_OK);
  CHECK(o.struct_size == sizeof o);
  CHECK(o.lookup_timeout_ms == 50);
  CHECK(o.connections_per_node == 2);
  CHECK(o.memcached_item_max == 1048576u);

  /* url and slot_bytes are required. */
  CHECK(kvo_remote_tier_options_validate(&o) == KVO_INVALID_ARGUMENT);
  CHECK(mentions("options->url"));
  o.url = "redis://127.0.0.1:6379";
  CHECK(kvo_remote_tier_options_validate(&o) == KVO_INVALID_ARGUMENT);
  CHECK(mentions("slot_bytes is 0"));
  o.slot_bytes = 4096;
  o.world_size = 2;
  o.dtype = "bf16";
  CHECK(kvo_remote_tier_options_validate(&o) == KVO_OK);

  o.url = "redis://host:70000";
  CHECK(kvo_remote_tier_options_validate(&o) == KVO_INVALID_ARGUMENT);
  CHECK(mentions("port 70000 is out of range"));
  o.url = "memcached://a:11211,b:11212";
  CHECK(kvo_remote_tier_url_info(&o, &kind, &nodes) == KVO_OK);
  CHECK(kind == KVO_REMOTE_MEMCACHED);
  CHECK(nodes == 2);
  o.url = "redis-cluster://a:7000,b:7001,c:7002";
  CHECK(kvo_remote_tier_url_info(&o, &kind, &nodes) == KVO_OK);
  CHECK(kind == KVO_REMOTE_REDIS_CLUSTER);
  CHECK(nodes == 3);

  CHECK(kvo_remote_tier_fingerprint(&o, &fp1) == KVO_OK);
  o.dtype = "fp8";
  CHECK(kvo_remote_tier_fingerprint(&o, &fp2) == KVO_OK);
  CHECK(fp1 != fp2);
  CHECK(fp1 != 0);

  o.connections_per_node = 0;
  CHECK(kvo_remote_tier_options_validate(&o) == KVO_INVALID_ARGUMENT);
  CHECK(mentions("connections_per_node 0"));
  o.connections_per_node = 2;
  o.struct_size = 1;
  CHECK(kvo_remote_tier_options_validate(&o) == KVO_INVALID_ARGUMENT);
  CHECK(mentions("struct_size"));
  CHECK(kvo_remote_value_bytes(100) == 164);

  if (failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("capi_remote_test: all checks passed\n");
  return 0;
}
