// Certificates for the TLS tests, made with the openssl binary in a folder: a CA (ca.pem,
// ca.key), a server certificate for localhost signed by it (server.pem, server.key), a client
// certificate signed by it (client.pem, client.key), and another CA that signed nothing
// (other.pem).
#pragma once

#include <cstdlib>
#include <string>

namespace recall::testing {

inline bool HaveOpenssl() { return std::system("command -v openssl > /dev/null") == 0; }

// False when openssl failed.
inline bool MakeTestCertificates(const std::string& dir) {
  const std::string script =
      "cd " + dir +
      " && "
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
      "  -subj /CN=recall-test-ca 2>/dev/null && "
      "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
      "  -subj /CN=localhost 2>/dev/null && "
      "printf 'subjectAltName=DNS:localhost' > san.ext && "
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
      "  -out server.pem -days 2 -extfile san.ext 2>/dev/null && "
      "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr "
      "  -subj /CN=client 2>/dev/null && "
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
      "  -out client.pem -days 2 2>/dev/null && "
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.pem -days 2 "
      "  -subj /CN=other-ca 2>/dev/null";
  return std::system(script.c_str()) == 0;
}

}  // namespace recall::testing
