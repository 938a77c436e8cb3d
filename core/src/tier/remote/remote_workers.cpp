// The worker threads (Note [Remote tier threads]): each owns one connection to its node, takes
// tasks from the node's queue, pipelines a task against the batch's deadline, reconnects after
// a failure of the node, and hands each op's answer back to its batch.
#include <algorithm>
#include <exception>
#include <string>
#include <vector>

#include "tier/remote/remote_tier_impl.hpp"

namespace kvoffload {

using namespace detail;

void RemoteTier::Impl::worker(Node& node) {
  WorkerConnection conn;
  std::vector<ValueOp*> ptrs;
  while (true) {
    Task task;
    {
      std::unique_lock lock(node.mutex);
      node.cv.wait(lock, [&] { return node.stopping || !node.queue.empty(); });
      if (node.queue.empty()) return;
      task = std::move(node.queue.front());
      node.queue.pop_front();
    }
    process(node, task, conn, ptrs);
    std::lock_guard lock(node.mutex);
    node.queued_bytes -= task.bytes;
  }
}

void RemoteTier::Impl::process(Node& node, Task& task, WorkerConnection& wc,
                               std::vector<ValueOp*>& ptrs) {
  std::unique_ptr<StoreConnection>& conn = wc.conn;
  const auto& ctx = task.ctx;
  const auto now = RemoteClock::now();
  if (now >= ctx->deadline) {
    for (const std::uint32_t i : task.ops) fail_op(ctx, i, "deadline passed before sending");
    return;
  }
  if (!node.breaker.allow(now)) {
    for (const std::uint32_t i : task.ops) fail_op(ctx, i, "node " + node.name + ": circuit open");
    return;
  }
  if (conn && wc.generation != node.generation.load()) conn.reset();  // opened before a failure
  if (!conn) {
    try {
      wc.generation = node.generation.load();
      const auto deadline = std::min(ctx->deadline, now + o.connect_timeout);
      conn = o.url.kind == RemoteKind::kMemcached
                 ? connect_memcached(node.endpoint, o.url, deadline)
                 : connect_redis(node.endpoint, o.url, deadline, pool.get());
    } catch (const std::exception& e) {
      if (is_auth_failure(e)) auth_failed(e.what());
      node_failed(node, e.what());
      for (const std::uint32_t i : task.ops) fail_op(ctx, i, e.what());
      return;
    }
  }
  ptrs.clear();
  for (const std::uint32_t i : task.ops) {
    ValueOp& op = ctx->ops[i];
    if (op.kind == OpKind::kPut && !op.hashed) {
      // Hashed here, on the node's thread, so the scheduler never pays for the checksum.
      op.header = make_header(fingerprint, op.chunk, op.copy, op.payload);
      op.hashed = true;
    }
    ptrs.push_back(&op);
  }
  std::string error;
  const bool ok = conn->run(ptrs, ctx->deadline, error);
  if (!ok) {
    conn.reset();
    if (is_auth_failure(error)) auth_failed("node " + node.name + ": " + error);
    node_failed(node, error);
  } else {
    node.breaker.on_success();
  }
  for (const std::uint32_t i : task.ops) {
    ValueOp& op = ctx->ops[i];
    switch (op.status) {
      case OpStatus::kPending:
        op.status = OpStatus::kError;
        op.detail = "node " + node.name + ": " + error;
        finish_op(ctx, i);
        break;
      case OpStatus::kMoved:
      case OpStatus::kAsk:
        redirect(ctx, i);
        break;
      default:
        finish_op(ctx, i);
        break;
    }
  }
}

}  // namespace kvoffload
