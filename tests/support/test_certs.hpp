#pragma once
// Certificates for the TLS tests, made by the test with the openssl program (Debian: openssl)
// in a temporary directory removed by the destructor: a CA, a server certificate it signed for
// 127.0.0.1 and localhost, a client certificate it signed, and a second CA that signed nothing
// the servers use (a trust store that must be refused). EC P-256 keys: quick to generate.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "remote_servers.hpp"

namespace kvoffload::test {

class TestCertificates {
 public:
  TestCertificates() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvo-certs-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    try {
      make_ca("ca");
      make_ca("other-ca");
      make_signed("server", "subjectAltName=IP:127.0.0.1,DNS:localhost");
      make_signed("client", "extendedKeyUsage=clientAuth");
    } catch (...) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
      throw;
    }
  }
  TestCertificates(const TestCertificates&) = delete;
  TestCertificates& operator=(const TestCertificates&) = delete;
  ~TestCertificates() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  [[nodiscard]] std::string file(const std::string& name) const { return (dir_ / name).string(); }
  [[nodiscard]] std::string ca() const { return file("ca.crt"); }
  [[nodiscard]] std::string other_ca() const { return file("other-ca.crt"); }

  // redis-server arguments for TLS only on `port` (the plain port off).
  [[nodiscard]] std::vector<std::string> redis_args(int port, bool require_client_cert) const {
    return {"--port",
            "0",
            "--tls-port",
            std::to_string(port),
            "--tls-cert-file",
            file("server.crt"),
            "--tls-key-file",
            file("server.key"),
            "--tls-ca-cert-file",
            ca(),
            "--tls-auth-clients",
            require_client_cert ? "yes" : "no"};
  }
  // redis-cli arguments for such a server.
  [[nodiscard]] std::vector<std::string> cli_args() const {
    return {"--tls", "--cacert", ca(), "--cert", file("client.crt"), "--key", file("client.key")};
  }

 private:
  void openssl(std::vector<std::string> args) const {
    args.insert(args.begin(), which("openssl"));
    std::string out;
    if (run_command(args, &out) != 0) throw std::runtime_error("openssl failed: " + out);
  }
  void make_ca(const std::string& name) const {
    openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", file(name + ".key"), "-out", file(name + ".crt"), "-days", "2", "-subj",
             "/CN=kvoffload test " + name});
  }
  void make_signed(const std::string& name, const std::string& extension) const {
    std::ofstream(file(name + ".ext")) << extension << "\n";
    openssl({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", file(name + ".key"), "-out", file(name + ".csr"), "-subj",
             "/CN=kvoffload test " + name});
    openssl({"x509", "-req", "-in", file(name + ".csr"), "-CA", ca(), "-CAkey", file("ca.key"),
             "-CAcreateserial", "-out", file(name + ".crt"), "-days", "2", "-extfile",
             file(name + ".ext")});
  }

  std::filesystem::path dir_;
};

}  // namespace kvoffload::test
