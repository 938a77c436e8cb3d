// Redis probes for `kvoffload remote check` (PING round trip, version, cluster mode, role) and
// the CLUSTER SLOTS map a cluster tier routes by, each on a connection of its own.
#include <string>
#include <vector>

#include <kvoffload/error.hpp>

#include "tier/remote/remote_redis_connection.hpp"

namespace kvoffload::detail {
namespace {

std::string reply_text(const redisReply* r) {
  return r != nullptr && r->str != nullptr ? std::string(r->str, r->len) : std::string();
}

}  // namespace

RedisProbe probe_redis(const RemoteEndpoint& endpoint, const RemoteUrl& url,
                       std::chrono::milliseconds timeout) {
  const auto deadline = RemoteClock::now() + timeout;
  auto conn = open_redis(endpoint, url, deadline);
  RedisProbe p;
  std::string error;
  const auto t0 = RemoteClock::now();
  ReplyPtr pong = conn->command({"PING"}, deadline, error);
  if (!pong) throw_io_error(endpoint, "PING", error);
  if (pong->type == REDIS_REPLY_ERROR) {
    throw_reply_error(endpoint, url, "PING", reply_text(pong.get()), ErrorCode::kNotAvailable);
  }
  p.rtt_ms = std::chrono::duration<double, std::milli>(RemoteClock::now() - t0).count();
  ReplyPtr info = conn->command({"INFO", "server"}, deadline, error);
  if (info && info->type == REDIS_REPLY_STRING) {
    const std::string text = reply_text(info.get());
    const auto at = text.find("redis_version:");
    if (at != std::string::npos) {
      const auto end = text.find_first_of("\r\n", at);
      p.version = text.substr(at + 14, end - at - 14);
    }
  }
  ReplyPtr cinfo = conn->command({"INFO", "cluster"}, deadline, error);
  if (cinfo && cinfo->type == REDIS_REPLY_STRING) {
    p.cluster_enabled = reply_text(cinfo.get()).find("cluster_enabled:1") != std::string::npos;
  }
  ReplyPtr role = conn->command({"ROLE"}, deadline, error);
  if (role && role->type == REDIS_REPLY_ARRAY && role->elements > 0) {
    p.role = reply_text(role->element[0]);
  }
  return p;
}

std::vector<SlotRange> cluster_slots(const RemoteEndpoint& endpoint, const RemoteUrl& url,
                                     std::chrono::milliseconds timeout) {
  const auto deadline = RemoteClock::now() + timeout;
  RemoteUrl no_db = url;  // a cluster has no databases
  no_db.db = 0;
  auto conn = open_redis(endpoint, no_db, deadline);
  std::string error;
  ReplyPtr r = conn->command({"CLUSTER", "SLOTS"}, deadline, error);
  if (!r)
    throw Error(ErrorCode::kNotAvailable,
                "CLUSTER SLOTS on " + endpoint.to_string() + ": " + error);
  if (r->type == REDIS_REPLY_ERROR && is_auth_refusal(reply_text(r.get()))) {
    throw Error(ErrorCode::kPermission, auth_failure_text(endpoint, url, reply_text(r.get())));
  }
  if (r->type == REDIS_REPLY_ERROR) {
    throw Error(ErrorCode::kMismatch,
                "CLUSTER SLOTS on " + endpoint.to_string() + ": " + reply_text(r.get()) +
                    " (is it a cluster node? use redis:// for a standalone server)");
  }
  std::vector<SlotRange> out;
  if (r->type != REDIS_REPLY_ARRAY) return out;
  for (std::size_t i = 0; i < r->elements; ++i) {
    const redisReply* e = r->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
        e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_INTEGER ||
        e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2) {
      continue;
    }
    SlotRange range;
    range.first = static_cast<std::uint32_t>(e->element[0]->integer);
    range.last = static_cast<std::uint32_t>(e->element[1]->integer);
    const redisReply* m = e->element[2];
    range.master.host = reply_text(m->element[0]);
    // An empty or "?" host means "the address you reached me on" (Redis 7).
    if (range.master.host.empty() || range.master.host == "?") range.master.host = endpoint.host;
    range.master.port = static_cast<std::uint16_t>(m->element[1]->integer);
    if (range.first <= range.last && range.last < kClusterSlots) out.push_back(range);
  }
  return out;
}

}  // namespace kvoffload::detail
