// How `recall chat` and `recall sessions` reach a coordinator (--server, --api-key, TLS) and
// show what it holds: the connection flags, the checked connection, and text made safe for a
// terminal.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "common/flags.h"
#include "recall/v1/chat.pb.h"

namespace recall::cli {

// How to reach the coordinator (chat and sessions).
struct ConnectOptions {
  std::string server = "127.0.0.1:50050";
  std::string api_key;
  std::string tls_ca, tls_cert, tls_key;
};

// --server, --api-key, --tls-ca, --tls-cert, --tls-key.
flags::FlagSet<ConnectOptions> ConnectFlags();

// A client of c.server, the flags checked first (the API key's characters, the port, that
// each TLS file is PEM holding what its flag says, the key matching the certificate), each
// error named by its flag.
absl::StatusOr<std::unique_ptr<Client>> Connect(const ConnectOptions& c);

// Text for a terminal: control characters but line ends and tabs as \xNN (C1 ones as \u00NN),
// so that a message holding escape sequences shows them instead of acting on the terminal.
std::string Printable(const std::string& text);

// A reply whose turn did not complete, as a listing marks it (" (interrupted: ...)"); "" for
// a complete one.
const char* StateNote(const v1::ChatMessage& m);

// The exit status of command `name` for `st`, after printing its error: 0 when OK, 2 for
// INVALID_ARGUMENT (with `usage` after it, when not null), else 1. `usage` is for an invalid
// command line; null for errors of the run itself (a server's INVALID_ARGUMENT is about the
// request, not the flags).
int Report(const char* name, const absl::Status& st, const char* usage);

}  // namespace recall::cli
