#include "cli/connection.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/files.h"
#include "common/status.h"
#include "common/tls/certificate.h"

namespace recall::cli {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  if (path.empty()) return std::string();
  RECALL_ASSIGN_OR_RETURN(std::string pem,
                          ReadSmallFile(absl::StrCat("--", flag), path, kMaxPemBytes));
  // gRPC's own word for a file that is no PEM is "empty address list".
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", path, " is not PEM (no -----BEGIN line)"));
  }
  return pem;
}

}  // namespace

flags::FlagSet<ConnectOptions> ConnectFlags() {
  flags::FlagSet<ConnectOptions> f;
  f.Section("connection")
      .String(
          "server", "HOST:PORT", "the coordinator (default 127.0.0.1:50050)",
          [](auto& o) -> auto& { return o.server; })
      .String(
          "api-key", "KEY", "sent as \"authorization: Bearer KEY\"",
          [](auto& o) -> auto& { return o.api_key; })
      .String(
          "tls-ca", "FILE", "connect with TLS, trusting this CA (PEM)",
          [](auto& o) -> auto& { return o.tls_ca; })
      .String(
          "tls-cert", "FILE", "client certificate for mTLS (PEM)",
          [](auto& o) -> auto& { return o.tls_cert; })
      .String(
          "tls-key", "FILE", "the client certificate's key (PEM)",
          [](auto& o) -> auto& { return o.tls_key; });
  return f;
}

absl::StatusOr<std::unique_ptr<Client>> Connect(const ConnectOptions& c) {
  if (absl::Status s = CheckApiKey(c.api_key); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--api-key", absl::StripPrefix(s.message(), "api_key")));
  }
  RECALL_ASSIGN_OR_RETURN(const auto host_port, flags::SplitHostPort("--server", c.server));
  if (host_port.second == 0) {  // (a listen address's "any free port"; nothing is there)
    return absl::InvalidArgumentError(
        "--server: port 0 names no server; give the port it listens on");
  }
  ClientOptions o;
  o.address = c.server;
  o.api_key = c.api_key;
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together (a client certificate and its key, for mTLS)");
  }
  if (!c.tls_ca.empty() || !c.tls_cert.empty()) {
    grpc::SslCredentialsOptions ssl;
    RECALL_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem(c.tls_ca, "tls-ca"));
    RECALL_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPem(c.tls_cert, "tls-cert"));
    RECALL_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPem(c.tls_key, "tls-key"));
    // Checked here: gRPC said only "empty address list", after 6 s of failed handshakes.
    if (!c.tls_ca.empty()) {
      RECALL_RETURN_IF_ERROR(tls::CheckHoldsCertificate("--tls-ca", c.tls_ca, ssl.pem_root_certs));
    }
    if (!c.tls_cert.empty()) {
      RECALL_RETURN_IF_ERROR(
          tls::CheckHoldsCertificate("--tls-cert", c.tls_cert, ssl.pem_cert_chain));
      RECALL_RETURN_IF_ERROR(tls::CheckKeyMatchesCertificate(c.tls_key, ssl.pem_private_key,
                                                             c.tls_cert, ssl.pem_cert_chain));
    }
    o.credentials = grpc::SslCredentials(ssl);
  }
  return Client::Connect(o);
}

std::string Printable(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto u = static_cast<unsigned char>(text[i]);
    const auto next = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0;
    if ((u < 0x20 && u != '\n' && u != '\t') || u == 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(u, absl::kZeroPad2));
    } else if (u == 0xc2 && next >= 0x80 && next <= 0x9f) {  // C1 (U+009B is CSI)
      absl::StrAppend(&out, "\\u00", absl::Hex(next, absl::kZeroPad2));
      ++i;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

const char* StateNote(const v1::ChatMessage& m) {
  switch (m.state()) {
    case v1::TURN_STATE_IN_PROGRESS:
      return " (in progress)";
    case v1::TURN_STATE_INTERRUPTED:
      return " (interrupted: not in later prompts)";
    case v1::TURN_STATE_FAILED:
      return " (failed: not in later prompts)";
    default:
      return "";
  }
}

int Report(const char* name, const absl::Status& st, const char* usage) {
  if (st.ok()) return 0;
  std::cerr << "recall " << name << ": " << st.message() << "\n";
  if (usage != nullptr && st.code() == absl::StatusCode::kInvalidArgument) {
    std::cerr << "\n" << usage;
  }
  return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace recall::cli
