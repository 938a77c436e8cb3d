// TlsStream (remote_tls.hpp): an OpenSSL client session on a connected, non-blocking socket,
// driven with poll() against the caller's deadline.
#include "tier/remote/remote_tls.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <kvoffload/error.hpp>

namespace kvoffload::detail {
namespace {

// OpenSSL's queued errors as one line (and the queue cleared: it is per thread, and a later
// call must not report this failure's leftovers).
std::string ssl_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    out += (out.empty() ? "" : "; ") + std::string(buf);
  }
  return out.empty() ? "no OpenSSL error queued" : out;
}

// An alert by which the server refuses our client certificate (or its absence). With TLS 1.3
// it arrives after the handshake, on the first read.
bool client_certificate_refused(unsigned long e) {
  switch (ERR_GET_REASON(e)) {
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
      return true;
    default:
      return false;
  }
}

int remaining(RemoteClock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - RemoteClock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<long long>(left.count(), 1 << 30));
}

bool is_ip_address(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace

struct TlsStream::Impl {
  // Members' types must not use the anonymous namespace (GCC's -Wsubobject-linkage, which fires
  // when this file is batched with others in a unity build, .ci/run's sanitizer stages).
  struct CtxDeleter {
    void operator()(SSL_CTX* c) const noexcept { SSL_CTX_free(c); }
  };
  struct SslDeleter {
    void operator()(SSL* s) const noexcept { SSL_free(s); }
  };
  std::unique_ptr<SSL_CTX, CtxDeleter> ctx;
  std::unique_ptr<SSL, SslDeleter> ssl;
  int fd = -1;
  bool client_cert = false;  // tls_cert given
  std::vector<char> out;     // gathered records

  // Waits for what OpenSSL asked for after a call returned `rc`. False (with `error`) when the
  // call failed for good or the deadline passed; `closed` is set on a clean TLS close.
  bool wait_for(int rc, RemoteClock::time_point deadline, const char* what, std::string& error,
                bool* closed = nullptr) {
    const int e = SSL_get_error(ssl.get(), rc);
    short events = 0;
    if (e == SSL_ERROR_WANT_READ) {
      events = POLLIN;
    } else if (e == SSL_ERROR_WANT_WRITE) {
      events = POLLOUT;
    } else if (e == SSL_ERROR_ZERO_RETURN) {
      if (closed != nullptr) *closed = true;
      error = "the server closed the TLS session";
      return false;
    } else if (e == SSL_ERROR_SYSCALL) {
      const int err = errno;
      ERR_clear_error();
      error = rc == 0 || err == 0 ? std::string("the server closed the connection")
                                  : errno_text(std::string("TLS ") + what, err);
      // A server that wants a client certificate sends its alert after a TLS 1.3 handshake and
      // closes; a request sent meanwhile meets a reset instead of the alert.
      error += client_cert
                   ? "; if the server refused the client certificate, check that a CA it trusts "
                     "signed tls_cert="
                   : "; if the server requires a client certificate, give tls_cert= and tls_key=";
      return false;
    } else if (client_certificate_refused(ERR_peek_error())) {
      // Worded as an authentication failure: the tier and `remote check` report it as one.
      error = "authentication failed: the server refused the client certificate (" + ssl_errors() +
              "); give tls_cert= and tls_key= signed by a CA the server trusts";
      return false;
    } else {
      error = std::string("TLS ") + what + ": " + ssl_errors();
      return false;
    }
    const int ms = remaining(deadline);
    if (ms == 0) {
      error = std::string("deadline passed during TLS ") + what;
      return false;
    }
    pollfd pfd{fd, events, 0};
    if (::poll(&pfd, 1, ms) < 0 && errno != EINTR) {
      error = errno_text("poll", errno);
      return false;
    }
    return true;
  }
};

TlsStream::TlsStream(int fd, const RemoteTls& tls, const RemoteEndpoint& endpoint,
                     RemoteClock::time_point deadline)
    : impl_(std::make_unique<Impl>()) {
  const std::string where = "TLS to " + endpoint.to_string();
  impl_->fd = fd;
  impl_->client_cert = !tls.cert_file.empty();
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
    throw_system_error("fcntl", errno, "O_NONBLOCK on the socket to " + endpoint.to_string());
  ERR_clear_error();
  impl_->ctx.reset(SSL_CTX_new(TLS_client_method()));
  if (!impl_->ctx) throw Error(ErrorCode::kSystem, where + ": SSL_CTX_new: " + ssl_errors());
  SSL_CTX* ctx = impl_->ctx.get();
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (!tls.ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, tls.ca_file.c_str(), nullptr) != 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  where + ": tls_ca " + tls.ca_file +
                      " holds no usable CA certificate (PEM): " + ssl_errors());
    }
  } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
    throw Error(ErrorCode::kSystem, where + ": the system's trust store: " + ssl_errors());
  }
  if (!tls.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, tls.cert_file.c_str()) != 1) {
      throw Error(ErrorCode::kInvalidArgument, where + ": tls_cert " + tls.cert_file +
                                                   " is not a PEM certificate: " + ssl_errors());
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, tls.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
      throw Error(ErrorCode::kInvalidArgument, where + ": tls_key " + tls.key_file +
                                                   " is not the PEM key of tls_cert " +
                                                   tls.cert_file + ": " + ssl_errors());
    }
  }
  impl_->ssl.reset(SSL_new(ctx));
  if (!impl_->ssl) throw Error(ErrorCode::kSystem, where + ": SSL_new: " + ssl_errors());
  SSL* ssl = impl_->ssl.get();
  SSL_set_fd(ssl, fd);
  const std::string& name = tls.server_name.empty() ? endpoint.host : tls.server_name;
  bool named = false;
  if (is_ip_address(name)) {
    named = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name.c_str()) == 1;
  } else {
    named = SSL_set1_host(ssl, name.c_str()) == 1 &&
            SSL_set_tlsext_host_name(ssl, const_cast<char*>(name.c_str())) == 1;
  }
  if (!named)
    throw Error(ErrorCode::kInvalidArgument, where + ": cannot verify the name '" + name + "'");
  while (true) {
    const int rc = SSL_connect(ssl);
    if (rc == 1) break;
    std::string error;
    const long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK) {
      ERR_clear_error();
      std::string why = where + ": the server's certificate did not verify (";
      why += X509_verify_cert_error_string(verify);
      why += "; checked against ";
      why +=
          tls.ca_file.empty() ? std::string("the system's trust store") : "tls_ca " + tls.ca_file;
      why += " and the name '";
      why += name;
      why += "')";
      throw Error(ErrorCode::kPermission, why);
    }
    if (!impl_->wait_for(rc, deadline, "handshake", error)) {
      if (error.starts_with("authentication failed")) {
        std::string why = error;
        why += " (";
        why += where;
        why += ")";
        throw Error(ErrorCode::kPermission, why);
      }
      std::string why = where + ": the handshake failed: ";
      why += error;
      why += " (is it a TLS port?)";
      throw Error(ErrorCode::kNotAvailable, why);
    }
  }
}

TlsStream::~TlsStream() {
  // A close_notify when it can be sent at once; the socket itself is closed by its owner.
  if (impl_ && impl_->ssl) {
    (void)SSL_shutdown(impl_->ssl.get());
    ERR_clear_error();
  }
}

bool TlsStream::write_all(const iovec* iov, std::size_t count, RemoteClock::time_point deadline,
                          std::string& error) {
  // Gathered into records of up to 16 KiB: one SSL_write per iovec would make a record (and a
  // MAC, and a header) of every 2-byte CRLF.
  constexpr std::size_t kRecord = 16 * 1024;
  std::size_t i = 0, off = 0;
  while (i < count) {
    impl_->out.clear();
    while (i < count && impl_->out.size() < kRecord) {
      const auto* base = static_cast<const char*>(iov[i].iov_base);
      const std::size_t take = std::min(iov[i].iov_len - off, kRecord - impl_->out.size());
      impl_->out.insert(impl_->out.end(), base + off, base + off + take);
      off += take;
      if (off == iov[i].iov_len) {
        ++i;
        off = 0;
      }
    }
    std::size_t sent = 0;
    while (sent < impl_->out.size()) {
      if (RemoteClock::now() >= deadline) {
        error = "deadline passed while sending";
        return false;
      }
      const int n = SSL_write(impl_->ssl.get(), impl_->out.data() + sent,
                              static_cast<int>(impl_->out.size() - sent));
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
        continue;
      }
      if (!impl_->wait_for(n, deadline, "send", error)) return false;
    }
  }
  return true;
}

long TlsStream::read_some(char* dst, std::size_t len, RemoteClock::time_point deadline,
                          std::string& error) {
  const int want = static_cast<int>(std::min<std::size_t>(len, 1 << 30));
  while (true) {
    if (RemoteClock::now() >= deadline) {
      error = "deadline passed waiting for a reply";
      return -1;
    }
    const int n = SSL_read(impl_->ssl.get(), dst, want);
    if (n > 0) return n;
    if (!impl_->wait_for(n, deadline, "receive", error)) return -1;
  }
}

}  // namespace kvoffload::detail
