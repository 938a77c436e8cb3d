// kvoffload.RemoteTierOptions and kvoffload.parse_remote_url: the remote tier's configuration
// (kvoffload::RemoteTierOptions), with validate() and the geometry fingerprint; times are
// milliseconds as ints.
#include <pybind11/stl.h>

#include <kvoffload/remote_tier.hpp>

#include "bindings.hpp"

namespace py = pybind11;

namespace kvoffload::python {

namespace {

template <std::chrono::milliseconds RemoteTierOptions::*Field>
void ms_property(py::class_<RemoteTierOptions>& c, const char* name) {
  c.def_property(
      name, [](const RemoteTierOptions& o) { return (o.*Field).count(); },
      [name](RemoteTierOptions& o, long long v) {
        if (v < 0) throw Error(ErrorCode::kInvalidArgument, std::string(name) + " must be >= 0");
        o.*Field = std::chrono::milliseconds(v);
      });
}

py::dict url_dict(const RemoteUrl& u) {
  py::list nodes;
  for (const auto& n : u.nodes) nodes.append(py::make_tuple(n.host, n.port));
  py::dict d;
  d["kind"] = std::string(to_string(u.kind));
  d["nodes"] = nodes;
  d["db"] = u.db;
  // Never the password: whether there is one, and where it came from.
  d["user"] = u.user;
  d["authenticates"] = u.authenticates();
  d["password_source"] = u.password_source();
  d["tls"] = u.tls.enabled;
  d["url"] = u.to_string();
  return d;
}

}  // namespace

void bind_remote(py::module_& m) {
  m.def(
      "parse_remote_url", [](const std::string& url) { return url_dict(RemoteUrl::parse(url)); },
      py::arg("url"),
      "Parses redis://host:port[/db], redis-cluster://host:port[,...] or "
      "memcached://host:port[,...]; raises kvoffload.Error naming what is wrong.");
  m.def("remote_value_bytes", &remote_value_bytes, py::arg("slot_bytes"),
        "Bytes of one stored value: the slot bytes plus the 64-byte header.");

  py::class_<RemoteTierOptions> c(m, "RemoteTierOptions",
                                  "Configuration of the distributed tier (Redis, Redis Cluster, "
                                  "memcached) shared by engines on several machines.");
  c.def(py::init([](const std::string& url, std::uint64_t slot_bytes, std::uint32_t world_size,
                    bool replicated, const std::string& tensor_layout, std::uint64_t block_bytes,
                    std::uint32_t blocks_per_chunk, const std::string& dtype) {
          RemoteTierOptions o;
          o.url = RemoteUrl::parse(url);
          o.geometry = {slot_bytes,  world_size,       replicated, tensor_layout,
                        block_bytes, blocks_per_chunk, dtype};
          return o;
        }),
        py::arg("url"), py::arg("slot_bytes"), py::arg("world_size") = 1,
        py::arg("replicated") = false, py::arg("tensor_layout") = "", py::arg("block_bytes") = 0,
        py::arg("blocks_per_chunk") = 0, py::arg("dtype") = "bytes");
  c.def_property(
      "url", [](const RemoteTierOptions& o) { return o.url.to_string(); },
      [](RemoteTierOptions& o, const std::string& url) { o.url = RemoteUrl::parse(url); });
  c.def_property_readonly(
      "kind", [](const RemoteTierOptions& o) { return std::string(to_string(o.url.kind)); });
  c.def_property_readonly("nodes",
                          [](const RemoteTierOptions& o) { return url_dict(o.url)["nodes"]; });
  c.def_property(
      "slot_bytes", [](const RemoteTierOptions& o) { return o.geometry.slot_bytes; },
      [](RemoteTierOptions& o, std::uint64_t v) { o.geometry.slot_bytes = v; });
  c.def_property(
      "world_size", [](const RemoteTierOptions& o) { return o.geometry.world_size; },
      [](RemoteTierOptions& o, std::uint32_t v) { o.geometry.world_size = v; });
  c.def_property(
      "replicated", [](const RemoteTierOptions& o) { return o.geometry.replicated; },
      [](RemoteTierOptions& o, bool v) { o.geometry.replicated = v; });
  c.def_property(
      "tensor_layout", [](const RemoteTierOptions& o) { return o.geometry.tensor_layout; },
      [](RemoteTierOptions& o, const std::string& v) { o.geometry.tensor_layout = v; });
  c.def_property(
      "dtype", [](const RemoteTierOptions& o) { return o.geometry.dtype; },
      [](RemoteTierOptions& o, const std::string& v) { o.geometry.dtype = v; });
  ms_property<&RemoteTierOptions::connect_timeout>(c, "connect_timeout_ms");
  ms_property<&RemoteTierOptions::lookup_timeout>(c, "lookup_timeout_ms");
  ms_property<&RemoteTierOptions::get_timeout>(c, "get_timeout_ms");
  ms_property<&RemoteTierOptions::put_timeout>(c, "put_timeout_ms");
  ms_property<&RemoteTierOptions::breaker_backoff>(c, "breaker_backoff_ms");
  ms_property<&RemoteTierOptions::breaker_backoff_max>(c, "breaker_backoff_max_ms");
  ms_property<&RemoteTierOptions::negative_ttl>(c, "negative_ttl_ms");
  c.def_readwrite("max_inflight_bytes", &RemoteTierOptions::max_inflight_bytes);
  c.def_readwrite("max_queued_bytes", &RemoteTierOptions::max_queued_bytes);
  c.def_readwrite("connections_per_node", &RemoteTierOptions::connections_per_node);
  c.def_readwrite("breaker_failures", &RemoteTierOptions::breaker_failures);
  c.def_readwrite("memcached_item_max", &RemoteTierOptions::memcached_item_max);
  c.def_readwrite("name", &RemoteTierOptions::name);
  c.def("validate", &RemoteTierOptions::validate,
        "Raises kvoffload.Error (INVALID_ARGUMENT) naming the field; touches no network.");
  c.def_property_readonly("fingerprint",
                          [](const RemoteTierOptions& o) { return o.geometry.fingerprint(); });
  c.def_property_readonly("geometry_description",
                          [](const RemoteTierOptions& o) { return o.geometry.describe(); });
  c.def("__repr__", [](const RemoteTierOptions& o) {
    return "RemoteTierOptions(url='" + o.url.to_string() + "', " + o.geometry.describe() + ")";
  });
}

}  // namespace kvoffload::python
