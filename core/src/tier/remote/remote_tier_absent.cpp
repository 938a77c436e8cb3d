// The remote tier of a library configured with -DKVOFFLOAD_REMOTE_TIER=OFF.
//
// Note [Built without the remote tier]: a GPU host (or any machine) without hiredis, libmemcached,
// the libsasl2 libmemcached.pc requires, libxxhash or OpenSSL can still build the library and the
// program: this file takes the place of the store clients (the kvoffload_remote object library,
// core/src/tier/sources.cmake). The API and the exported symbols stay the same, so an engine, the
// C API and the Python module compile and link against either build; what is configuration
// (RemoteUrl parsing and its secrets, RemoteTierOptions::validate, remote_value_bytes, a check
// report's verdicts) works as in any build. Everything that would talk to a store, or that names
// the values of one, is refused where the URL is used, with ErrorCode::kNotAvailable and the same
// sentence: RemoteTier::open (so OffloadStack, `kvoffload run --remote-tier`, the C API's and the
// vLLM worker's remote tiers), check_remote (`kvoffload remote check`) and
// RemoteGeometry::fingerprint (the C API's and Python's fingerprint). No RemoteTier object can
// exist in this build (its constructor is private and open() throws), so its members, which must
// be defined for its vtable and exports, are unreachable and abort if that invariant ever broke.
// Tested by remote_absent_tests, which links the rest of the library with this file.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <kvoffload/error.hpp>
#include <kvoffload/remote_tier.hpp>

namespace kvoffload {

namespace {

[[noreturn]] void refuse(const std::string& what) {
  throw Error(ErrorCode::kNotAvailable,
              what +
                  ": this build has no remote tier; rebuild with -DKVOFFLOAD_REMOTE_TIER=ON (it "
                  "needs hiredis, libmemcached, libxxhash and OpenSSL; Debian: libhiredis-dev "
                  "libmemcached-dev libxxhash-dev libssl-dev)");
}

[[noreturn]] void no_tier_exists(const char* member) noexcept {
  (void)std::fprintf(
      stderr,
      "kvoffload: RemoteTier::%s called in a build without the remote tier, where no "
      "RemoteTier can be opened (a bug)\n",
      member);
  std::abort();
}

}  // namespace

bool remote_tier_built() noexcept {
  return false;
}

std::unique_ptr<RemoteTier> RemoteTier::open(const RemoteTierOptions& options) {
  refuse("remote tier " + options.name + " at " + options.url.to_string());
}

RemoteCheckReport check_remote(const RemoteUrl& url, std::chrono::milliseconds /*timeout*/) {
  refuse("remote check of " + url.to_string());
}

std::uint64_t RemoteGeometry::fingerprint() const {
  refuse("the remote tier's geometry fingerprint");
}

// The private state a RemoteTier would own: none, since none is ever made (~RemoteTier needs the
// type complete to destroy impl_).
struct RemoteTier::Impl {};

RemoteTier::RemoteTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteTier::~RemoteTier() = default;

const std::string& RemoteTier::name() const noexcept {
  no_tier_exists("name");
}
const RemoteTierOptions& RemoteTier::options() const noexcept {
  no_tier_exists("options");
}
std::string RemoteTier::store_key(const BlockKey& /*key*/, std::uint32_t /*copy*/) const {
  no_tier_exists("store_key");
}
TierBatch RemoteTier::put(std::span<const TierPut> /*items*/) {
  no_tier_exists("put");
}
TierBatch RemoteTier::get(std::span<const TierGet> /*items*/) {
  no_tier_exists("get");
}
bool RemoteTier::contains(const BlockKey& /*key*/) const {
  no_tier_exists("contains");
}
void RemoteTier::lookup(std::span<const BlockKey> /*keys*/, std::span<TierPresence> /*out*/) {
  no_tier_exists("lookup");
}
std::optional<TierPresence> RemoteTier::known(const BlockKey& /*key*/) {
  no_tier_exists("known");
}
TierBatch RemoteTier::remove(std::span<const BlockKey> /*keys*/) {
  no_tier_exists("remove");
}
void RemoteTier::drain() {
  no_tier_exists("drain");
}
RemoteStats RemoteTier::remote_stats() const {
  no_tier_exists("remote_stats");
}
std::string RemoteTier::first_auth_failure() const {
  no_tier_exists("first_auth_failure");
}
TierStats RemoteTier::stats() const {
  no_tier_exists("stats");
}
bool RemoteTier::close() noexcept {
  no_tier_exists("close");
}

}  // namespace kvoffload
