#pragma once
// RemoteTier: a SecondaryTier on an existing distributed store, so engines on different machines
// share KV chunks. Stores: Redis/Valkey standalone and Redis Cluster (RESP through hiredis; the
// cluster routing -- CLUSTER SLOTS, CRC16 hash slots, MOVED/ASK -- is ours, because Debian's
// hiredis 0.14 has none), and memcached (libmemcached, its consistent hashing).
//
// Values (Note [Remote values]): one value per chunk key and rank slot (per chunk key when
// replicated), under a key namespaced by the geometry fingerprint:
//     kvo1:<fingerprint, 16 hex>:<chunk key, 32 hex>:<copy index | r>
// (no braces: a Redis Cluster hash tag would pin an engine's keys to one slot). The value is a
// 64-byte header -- magic, format version, fingerprint, chunk key and copy echoed back, payload
// length, xxh3-64 of the payload, xxh3-64 of the header -- followed by the slot bytes. Anything
// that does not verify is a miss, counted as corrupt; it never reaches a region slot.
//
// Behaviour: put is write-through from TieredStore (asynchronous; the primary store completed
// already). lookup() is asynchronous: a key never seen answers kPending while an EXISTS runs in
// the background, and kAbsent once `lookup_timeout` passed without an answer. Every network
// operation has a deadline; per node the requests are pipelined with at most
// `max_inflight_bytes` in flight, and a node that fails `breaker_failures` operations in a row is
// skipped (misses) for a backoff that doubles up to `breaker_backoff_max`. An unreachable store
// at open() is a warning, not an error: the tier answers misses until a node comes back; a store
// that refuses the credentials (or their absence) is an error (kPermission) at open().
// The URL, with credentials and TLS, is described in remote_url.hpp.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <kvoffload/remote_url.hpp>
#include <kvoffload/tier.hpp>

namespace kvoffload {

// What makes two engines' chunk bytes interchangeable. Engines with different fingerprints never
// read each other's values (their keys differ, and the header is checked again on read).
struct KVOFFLOAD_API RemoteGeometry {
  std::uint64_t slot_bytes = 0;        // P: bytes of one rank's slot of one chunk (> 0)
  std::uint32_t world_size = 1;        // ranks (> 0)
  bool replicated = false;             // MLA: one copy shared by all ranks
  std::string tensor_layout;           // the engine's description of how a slot packs its tensors
  std::uint64_t block_bytes = 0;       // bytes of one GPU block of one tensor (0: not given)
  std::uint32_t blocks_per_chunk = 0;  // GPU blocks per chunk (0: not given)
  std::string dtype = "bytes";         // element type tag, e.g. "bf16", "fp8_e4m3"
  // Bytes from one rank's slot to the next in a region row (the region's aligned slot stride,
  // RegionGeometry::slot_stride()); 0: slot_bytes (packed). A host layout detail: values carry
  // slot_bytes, so it is not part of the fingerprint.
  std::uint64_t slot_stride = 0;

  [[nodiscard]] std::uint32_t copies() const noexcept { return replicated ? 1 : world_size; }
  [[nodiscard]] std::uint64_t stride() const noexcept {
    return slot_stride != 0 ? slot_stride : slot_bytes;
  }
  // xxh3-64 of describe(); includes the value format version.
  [[nodiscard]] std::uint64_t fingerprint() const;
  // The canonical text the fingerprint hashes.
  [[nodiscard]] std::string describe() const;
};

struct KVOFFLOAD_API RemoteTierOptions {
  RemoteUrl url;
  RemoteGeometry geometry;
  std::chrono::milliseconds connect_timeout{200};  // one TCP connect (+ SELECT)
  // The caller's budget of an existence check: past it the key is a miss (lookup_timeouts), while
  // the check itself may run until max(lookup_timeout, get_timeout) before it is an error.
  std::chrono::milliseconds lookup_timeout{50};
  std::chrono::milliseconds get_timeout{1000};     // a get batch, from submission
  std::chrono::milliseconds put_timeout{1000};     // a put batch, from submission
  std::uint64_t max_inflight_bytes = 32ULL << 20;  // per node: pipelined request+reply bytes
  std::uint64_t max_queued_bytes = 256ULL << 20;   // per node: beyond it puts fail at once
  unsigned connections_per_node = 2;               // worker threads (one connection each)
  unsigned breaker_failures = 2;                   // consecutive failures that open a node
  std::chrono::milliseconds breaker_backoff{100};  // first open period; doubles per failed probe
  std::chrono::milliseconds breaker_backoff_max{5000};
  std::chrono::milliseconds negative_ttl{500};   // an absent answer is reused this long
                                                 // (at least lookup_timeout)
  std::uint64_t presence_capacity = 1ULL << 20;  // keys whose presence is remembered
  // memcached only: the servers' item size limit (memcached -I, default 1m). A value is the slot
  // bytes plus a 64-byte header and must fit (memcached also needs a little room for the item
  // header: use -I of at least slot_bytes + 1 KiB, e.g. -I 4m for 2 MiB slots).
  std::uint64_t memcached_item_max = 1ULL << 20;
  std::chrono::milliseconds warn_interval{5000};  // rate limit of repeated warnings
  // Note [Gets into the destination]: Redis gets receive a value's payload from the socket
  // straight into its slot of TierGet::into and verify it there (no staging buffer, no copy),
  // after its header has verified. What a get that is not kOk leaves in `into` then: the slot of
  // a value that is absent, or whose header does not verify (another geometry, key, copy, length,
  // format, a damaged header), is untouched; the slot of a value whose payload fails its checksum
  // holds the unverified bytes received, and of a transfer cut by its deadline or a failure of
  // the connection, the part received; the other slots of the row hold their own values. Off
  // (the default), every value is received into a recycled buffer, verified, and copied into
  // `into` only when the whole row verified (the TierGet contract: untouched on a miss). For
  // callers that discard the destination of an item that did not succeed, as vLLM's tiering does
  // (kvoffload.vllm's remote tier turns it on). memcached gets always take the second way
  // (libmemcached owns the receive): one copy, out of libmemcached's value, after the row verified.
  bool verify_in_destination = false;
  std::string name = "remote";

  // Throws kInvalidArgument naming the field and what is allowed. Touches no network.
  void validate() const;
};

// Bytes of the value stored for one slot of `slot_bytes`.
KVOFFLOAD_API std::uint64_t remote_value_bytes(std::uint64_t slot_bytes) noexcept;

struct RemoteStats {
  std::uint64_t stored = 0;          // rows written (every copy acknowledged)
  std::uint64_t put_errors = 0;      // rows not written (error, timeout, open circuit, full queue)
  std::uint64_t loaded = 0;          // rows read back and verified
  std::uint64_t get_misses = 0;      // rows absent (never stored, evicted, node restarted empty)
  std::uint64_t corrupt = 0;         // values that did not verify (counted per value)
  std::uint64_t get_errors = 0;      // rows not read because of an error or timeout
  std::uint64_t lookups = 0;         // keys asked through lookup()
  std::uint64_t lookup_present = 0;  // resolved present
  std::uint64_t lookup_absent = 0;   // resolved absent, or answered absent at the budget
  // Of lookup_absent: keys answered absent because no answer came within lookup_timeout. Late is
  // a miss, not an error: the check goes on (its network deadline is get_timeout), and its
  // answer, when it lands, is remembered for the next lookup (and counted in lookup_present).
  std::uint64_t lookup_timeouts = 0;
  std::uint64_t lookup_errors = 0;  // existence checks that failed (answered absent)
  std::uint64_t redirects = 0;      // cluster MOVED/ASK followed
  std::uint64_t map_refreshes = 0;  // cluster slot maps loaded
  std::uint64_t tasks = 0;  // pipelines handed to node connections (a batch per node is cut into
                            // at most one per connection unless the in-flight window is smaller)
  std::uint64_t breaker_opens = 0;  // a node's circuit opened
  std::uint64_t nodes = 0;          // nodes known
  std::uint64_t nodes_open = 0;     // nodes whose circuit is open now
  // Connections and requests the store refused for their credentials (WRONGPASS, NOAUTH,
  // NOPERM) or, over TLS, because its certificate did not verify. Any is a misconfiguration:
  // `kvoffload run` fails with first_auth_failure().
  std::uint64_t auth_failures = 0;
  // The run's summary: misses = get_misses + lookup_absent; errors = put + get + lookup errors.
  [[nodiscard]] std::uint64_t misses() const noexcept { return get_misses + lookup_absent; }
  [[nodiscard]] std::uint64_t errors() const noexcept {
    return put_errors + get_errors + lookup_errors;
  }
};

class KVOFFLOAD_API RemoteTier final : public SecondaryTier {
 public:
  // Validates, resolves nothing it cannot reach within connect_timeout, and starts the node
  // workers. An unreachable store logs a warning and the tier degrades to misses.
  // Throws kInvalidArgument for bad options (and, for memcached, slots larger than the item size).
  static std::unique_ptr<RemoteTier> open(const RemoteTierOptions& options);
  ~RemoteTier() override;

  [[nodiscard]] const std::string& name() const noexcept override;
  TierBatch put(std::span<const TierPut> items) override;
  TierBatch get(std::span<const TierGet> items) override;
  [[nodiscard]] bool contains(const BlockKey& key) const override;  // known present, no I/O
  void lookup(std::span<const BlockKey> keys, std::span<TierPresence> out) override;
  // The answer lookup() would give for `key` from what the tier remembers, without starting an
  // existence check: nullopt for a key it has no answer for (never asked, forgotten, or an absent
  // answer that expired). Lets a caller collect the unknown keys of a scheduler step and ask
  // them in one lookup() batch (one pipelined EXISTS per node instead of one per key).
  [[nodiscard]] std::optional<TierPresence> known(const BlockKey& key);
  TierBatch remove(std::span<const BlockKey> keys) override;  // forgets locally; shared data stays
  void drain() override;
  [[nodiscard]] TierStats stats() const override;
  bool close() noexcept override;

  [[nodiscard]] RemoteStats remote_stats() const;
  // The message of the first refusal counted in auth_failures (empty: none).
  [[nodiscard]] std::string first_auth_failure() const;
  [[nodiscard]] const RemoteTierOptions& options() const noexcept;
  // The store key of one value (for tools and tests).
  [[nodiscard]] std::string store_key(const BlockKey& key, std::uint32_t copy) const;

  struct Impl;

 private:
  explicit RemoteTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// `kvoffload remote check`: connects to every node, measures a round trip, and for a cluster
// reads the slot map.
struct RemoteNodeReport {
  RemoteEndpoint endpoint;
  bool reachable = false;
  double rtt_ms = 0;        // one PING (Redis) or VERSION (memcached) round trip
  std::string role;         // "standalone" | "master" | "replica" | "memcached"
  std::string version;      // server version when known
  std::uint32_t slots = 0;  // cluster: hash slots this node serves as master
  std::string error;        // why it is unreachable or unusable
  // It answered, but refused the credentials (WRONGPASS, NOAUTH) or the TLS handshake failed:
  // reachable is false, and `error` says which.
  bool auth_failed = false;
};

struct KVOFFLOAD_API RemoteCheckReport {
  RemoteUrl url;
  std::vector<RemoteNodeReport> nodes;
  std::uint32_t slots_assigned = 0;  // cluster: slots the slot map gives a master
  std::uint32_t slots_covered = 0;   // cluster: slots whose master answered (16384: complete)
  [[nodiscard]] bool reachable() const noexcept;  // at least one node answered
  // A node refused the credentials (or their absence), or its TLS certificate did not verify.
  [[nodiscard]] bool refused() const noexcept;
  // Empty when the store can serve every key as given: a cluster whose every slot has a
  // reachable master, every memcached server reachable, a standalone Redis reachable and not in
  // cluster mode. Otherwise one sentence saying what is wrong.
  [[nodiscard]] std::string problem() const;
};

KVOFFLOAD_API RemoteCheckReport check_remote(const RemoteUrl& url,
                                             std::chrono::milliseconds timeout);

// False in a library configured with -DKVOFFLOAD_REMOTE_TIER=OFF (no hiredis, libmemcached,
// libxxhash, OpenSSL). Such a library parses and validates remote URLs and options as any other,
// but RemoteTier::open, check_remote and RemoteGeometry::fingerprint throw kNotAvailable: "this
// build has no remote tier; rebuild with -DKVOFFLOAD_REMOTE_TIER=ON".
KVOFFLOAD_API bool remote_tier_built() noexcept;

}  // namespace kvoffload
