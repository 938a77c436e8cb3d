#pragma once
// TLS for RESP connections (rediss://, rediss-cluster://) over OpenSSL. Debian's hiredis 0.14
// has no TLS (hiredis_ssl arrived in 1.0), and the connection's I/O is ours anyway (the top of
// remote_redis.cpp): a TlsStream wraps the connected socket, and the connection's sends and
// receives go through it, against the same deadlines.
//
// The server's certificate is always verified: its chain against tls_ca (or the system's trust
// store), and its name against tls_server_name or the node's host (an IP address is matched
// against the certificate's IP addresses). There is no option to turn verification off.

#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <string>

#include <kvoffload/remote_url.hpp>

#include "tier/remote/remote_ops.hpp"

namespace kvoffload::detail {

class TlsStream {
 public:
  // Handshakes on `fd` (connected; made non-blocking here; still owned by the caller) before
  // `deadline`. Throws Error: kPermission when the certificate does not verify, kInvalidArgument
  // when the CA, certificate or key files cannot be loaded, kNotAvailable for any other failure
  // (a server that does not speak TLS, a reset, the deadline).
  TlsStream(int fd, const RemoteTls& tls, const RemoteEndpoint& endpoint,
            RemoteClock::time_point deadline);
  ~TlsStream();
  TlsStream(const TlsStream&) = delete;
  TlsStream& operator=(const TlsStream&) = delete;

  // Sends every byte of the iovecs (gathered into TLS records of up to 16 KiB). False with
  // `error` set at the deadline or on failure.
  bool write_all(const iovec* iov, std::size_t count, RemoteClock::time_point deadline,
                 std::string& error);
  // Receives what is available (waiting for at least one byte): > 0 bytes, or -1 with `error`.
  long read_some(char* dst, std::size_t len, RemoteClock::time_point deadline, std::string& error);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvoffload::detail
