// A batch from call to completion: its ops (one per chunk row and copy) and rows, the one
// submit path put() and get() share, routing the ops to nodes and cutting them into tasks
// (Note [Task size]), cluster redirects, and the completion of a row once its last copy is in.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "tier/remote/remote_tier_impl.hpp"

namespace kvoffload {

using namespace detail;

std::shared_ptr<RemoteTier::Impl::BatchCtx> RemoteTier::Impl::make_ctx(
    OpKind kind, std::size_t rows, std::chrono::milliseconds timeout) {
  auto ctx = std::make_shared<BatchCtx>();
  ctx->kind = kind;
  ctx->num_rows = rows;
  ctx->rows = std::make_unique<Row[]>(rows);
  ctx->rows_left = rows;
  ctx->ops.resize(rows * copies);
  ctx->deadline = RemoteClock::now() + timeout;
  return ctx;
}

void RemoteTier::Impl::init_row(BatchCtx& ctx, std::size_t r, const BlockKey& key) {
  ctx.rows[r].key = key;
  ctx.rows[r].remaining = copies;
  for (std::uint32_t c = 0; c < copies; ++c) {
    ValueOp& op = ctx.ops[r * copies + c];
    op.kind = ctx.kind;
    op.row = static_cast<std::uint32_t>(r);
    op.copy = copy_id(c);
    op.chunk = key;
    op.fingerprint = fingerprint;
    op.expected_payload = slot;
    op.key = make_store_key(fingerprint, key, op.copy);
  }
}

void RemoteTier::Impl::begin(const std::shared_ptr<BatchCtx>& ctx) {
  {
    std::lock_guard lock(outstanding_mutex);
    ++outstanding;
  }
  in_flight += ctx->num_rows;
}

void RemoteTier::Impl::fail_op(const std::shared_ptr<BatchCtx>& ctx, std::uint32_t i,
                               std::string why) {
  ValueOp& op = ctx->ops[i];
  op.status = OpStatus::kError;
  op.detail = std::move(why);
  finish_op(ctx, i);
}
// Put and get share this path (only the timeout, what a row's bytes are and the payload
// differ): one op per (row, copy), a row whose buffer is not copies x slot stride bytes (as
// TieredStore hands rows) fails each of its ops without I/O, the others are routed and queued.
TierBatch RemoteTier::Impl::submit_rows(OpKind kind, std::span<const RowIo> items) {
  if (items.empty()) return {};
  const bool put = kind == OpKind::kPut;
  auto ctx = make_ctx(kind, items.size(), put ? o.put_timeout : o.get_timeout);
  std::vector<BlockKey> keys(items.size());
  for (std::size_t r = 0; r < items.size(); ++r) keys[r] = items[r].key;
  ctx->promise.emplace(keys);
  TierBatch batch = ctx->promise->batch();
  begin(ctx);
  std::vector<std::uint32_t> indices;
  indices.reserve(ctx->ops.size());
  const std::uint64_t row_bytes = stride * copies;
  for (std::size_t r = 0; r < items.size(); ++r) {
    const RowIo& item = items[r];
    init_row(*ctx, r, item.key);
    ctx->rows[r].into = item.into;
    const std::size_t size = put ? item.payload.size() : item.into.size();
    for (std::uint32_t c = 0; c < copies; ++c) {
      const auto i = static_cast<std::uint32_t>(r * copies + c);
      if (size != row_bytes) {
        fail_op(ctx, i,
                std::string(put ? "row" : "buffer") + " of " + std::to_string(size) +
                    " bytes; expected " + std::to_string(row_bytes));
        continue;
      }
      if (put) ctx->ops[i].payload = item.payload.subspan(c * stride, slot);
      if (!put && o.verify_in_destination) ctx->ops[i].into = item.into.subspan(c * stride, slot);
      indices.push_back(i);
    }
  }
  submit(ctx, indices);
  return batch;
}

void RemoteTier::Impl::submit_exists(std::span<const BlockKey> keys) {
  // The budget is the caller's (the entry turns absent at lookup_timeout, see answer_locked); the
  // check runs to a get's deadline, so an answer that is late but comes is remembered, and only a
  // node that does not answer at all counts as failed (lookup_errors, its circuit breaker).
  auto ctx = make_ctx(OpKind::kExists, keys.size(), std::max(o.lookup_timeout, o.get_timeout));
  begin(ctx);
  std::vector<std::uint32_t> indices(ctx->ops.size());
  for (std::size_t r = 0; r < keys.size(); ++r) init_row(*ctx, r, keys[r]);
  for (std::uint32_t i = 0; i < indices.size(); ++i) indices[i] = i;
  submit(ctx, indices);
}

void RemoteTier::Impl::submit(const std::shared_ptr<BatchCtx>& ctx,
                              std::span<const std::uint32_t> indices) {
  std::size_t n_nodes = 0;
  {
    std::shared_lock lock(nodes_mutex);
    n_nodes = nodes.size();
  }
  std::vector<std::vector<std::uint32_t>> per_node(n_nodes);
  for (const std::uint32_t i : indices) {
    ValueOp& op = ctx->ops[i];
    if (op.status != OpStatus::kPending) continue;  // failed at validation
    const std::uint32_t n = route(op.key);
    if (n != kNoNode && n >= per_node.size()) per_node.resize(n + 1);  // a node added since
    if (n == kNoNode) {
      fail_op(ctx, i,
              "no node serves hash slot " + std::to_string(cluster_slot(op.key.view())) +
                  " (no cluster slot map yet)");
      continue;
    }
    op.node = n;
    per_node[n].push_back(i);
  }
  for (std::uint32_t n = 0; n < per_node.size(); ++n) {
    if (!per_node[n].empty()) enqueue(ctx, n, per_node[n]);
  }
}

void RemoteTier::Impl::enqueue(const std::shared_ptr<BatchCtx>& ctx, std::uint32_t n,
                               std::span<const std::uint32_t> indices) {
  Node& node = *node_at(n);
  if (node.breaker.rejecting(RemoteClock::now())) {
    for (const std::uint32_t i : indices) fail_op(ctx, i, "node " + node.name + ": circuit open");
    return;
  }
  // Note [Task size]: a task is at most the window, and at most an equal share of this batch
  // per connection, so one batch keeps every connection of the node busy (32 values of 256 KiB
  // on 4 connections: 4 tasks of 2 MiB, not 2 of 4 MiB and two idle connections). Below
  // kMinShare a batch is not split further: tiny requests (EXISTS) gain nothing from it.
  constexpr std::uint64_t kMinShare = 64 * 1024;
  std::uint64_t total = 0;
  for (const std::uint32_t i : indices) total += ctx->ops[i].wire_bytes();
  const std::uint64_t share = (total + o.connections_per_node - 1) / o.connections_per_node;
  const std::uint64_t limit = std::min(window, std::max(share, kMinShare));
  std::vector<Task> tasks;
  Task t{ctx, {}, 0};
  for (const std::uint32_t i : indices) {
    const std::uint64_t b = ctx->ops[i].wire_bytes();
    if (!t.ops.empty() && t.bytes + b > limit) {
      tasks.push_back(std::move(t));
      t = Task{ctx, {}, 0};
    }
    t.ops.push_back(i);
    t.bytes += b;
  }
  tasks.push_back(std::move(t));
  std::vector<std::uint32_t> refused;
  {
    std::lock_guard lock(node.mutex);
    for (auto& task : tasks) {
      // Puts beyond the queue cap fail now: a slow node must not pin region slots without bound.
      if (ctx->kind == OpKind::kPut && node.queued_bytes + task.bytes > o.max_queued_bytes) {
        refused.insert(refused.end(), task.ops.begin(), task.ops.end());
        continue;
      }
      node.queued_bytes += task.bytes;
      node.queue.push_back(std::move(task));
      ++tasks_sent;
    }
  }
  node.cv.notify_all();
  for (const std::uint32_t i : refused) {
    fail_op(ctx, i,
            "node " + node.name + ": send queue full (" + std::to_string(o.max_queued_bytes) +
                " bytes)");
  }
}

void RemoteTier::Impl::redirect(const std::shared_ptr<BatchCtx>& ctx, std::uint32_t i) {
  ValueOp& op = ctx->ops[i];
  if (++op.redirects > kMaxRedirects) {
    op.status = OpStatus::kError;
    op.detail = "too many cluster redirects";
    finish_op(ctx, i);
    return;
  }
  ++redirects;
  const bool ask = op.status == OpStatus::kAsk;
  const std::uint32_t target = node_for(op.redirect_to);
  if (!ask) {
    std::unique_lock lock(map_mutex);
    if (!slot_map.empty()) slot_map[op.redirect_slot] = target;
  }
  if (!ask) request_refresh();
  op.asking = ask;
  op.status = OpStatus::kPending;
  op.value = HeldValue{};
  op.in_place = false;
  op.node = target;
  const std::uint32_t one[] = {i};
  enqueue(ctx, target, one);
}

void RemoteTier::Impl::finish_op(const std::shared_ptr<BatchCtx>& ctx, std::uint32_t i) {
  Row& row = ctx->rows[ctx->ops[i].row];
  if (row.remaining.fetch_sub(1) == 1) finish_row(*ctx, ctx->ops[i].row);
}

void RemoteTier::Impl::finish_row(BatchCtx& ctx, std::uint32_t r) {
  Row& row = ctx.rows[r];
  const std::span<ValueOp> ops(ctx.ops.data() + static_cast<std::size_t>(r) * copies, copies);
  const ValueOp* error = nullptr;
  const ValueOp* bad = nullptr;
  bool absent = false;
  for (const ValueOp& op : ops) {
    if (op.status == OpStatus::kError && error == nullptr) error = &op;
    if (op.status == OpStatus::kCorrupt) {
      ++corrupt;
      if (bad == nullptr) bad = &op;
    }
    if (op.status == OpStatus::kAbsent) absent = true;
  }
  const bool ok = error == nullptr && bad == nullptr && !absent;
  switch (ctx.kind) {
    case OpKind::kPut:
      if (ok) {
        ++stored;
        remember(row.key, Known::kPresent, false);
        ctx.promise->set(r, TierItemStatus::kOk);
      } else {
        ++put_errors;
        const ValueOp& e = error != nullptr ? *error : ops.front();
        ctx.promise->set(r, TierItemStatus::kFailed, 0,
                         std::string(e.key.view()) + ": " + e.detail);
      }
      break;
    case OpKind::kGet:
      if (ok) {
        for (std::uint32_t c = 0; c < copies; ++c) {
          if (ops[c].in_place) continue;  // verified where it landed (Note [Gets into the ...])
          std::memcpy(row.into.data() + c * stride, ops[c].value.bytes.data() + kRemoteHeaderBytes,
                      slot);
        }
        ++loaded;
        ctx.promise->set(r, TierItemStatus::kOk);
      } else if (error != nullptr) {
        ++get_errors;
        forget(row.key);
        ctx.promise->set(r, TierItemStatus::kFailed, 0,
                         std::string(error->key.view()) + ": " + error->detail);
      } else {
        ++get_misses;
        remember(row.key, Known::kAbsent, true);
        ctx.promise->set(r, TierItemStatus::kMiss, 0,
                         bad != nullptr ? std::string(bad->key.view()) + ": " + bad->detail
                                        : std::string("absent from the remote store"));
      }
      for (ValueOp& op : ops) op.value = HeldValue{};  // release the replies now
      break;
    case OpKind::kExists:
      if (ok) {
        ++lookup_present;
        resolve(row.key, Known::kPresent, false);
      } else if (error != nullptr) {
        ++lookup_errors;
        resolve(row.key, Known::kAbsent, true);
      } else {
        resolve(row.key, Known::kAbsent, false);
      }
      break;
  }
  --in_flight;
  if (ctx.rows_left.fetch_sub(1) == 1) {
    std::lock_guard lock(outstanding_mutex);
    if (--outstanding == 0) outstanding_cv.notify_all();
  }
}

}  // namespace kvoffload
