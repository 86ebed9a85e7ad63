// A minimal HTTP/1.1 client for tests of common/http's servers (the agent's
// and the collector's): one request per connection, the whole reply read
// until the server closes. Failures are GoogleTest failures.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <map>
#include <string>

namespace tlsprof::http::testing {

struct Reply {
  int status = 0;
  std::string head;                            // the status line and headers, as sent
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// A TCP connection to 127.0.0.1:port; -1 (and a GoogleTest failure) when
// it cannot be made. The caller closes it.
inline int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    ADD_FAILURE() << "connect to port " << port << " failed";
    return -1;
  }
  return fd;
}

// One request over a fresh connection; the server closes it after the reply.
inline Reply Send(int port, const std::string& method, const std::string& target,
                  const std::string& extra_headers = "") {
  Reply r;
  const int fd = Connect(port);
  if (fd < 0) return r;
  const std::string request =
      method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + extra_headers + "\r\n";
  EXPECT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string raw;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) raw.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) {
    ADD_FAILURE() << "no complete header in: " << raw.substr(0, 200);
    return r;
  }
  r.head = raw.substr(0, end + 2);
  r.body = raw.substr(end + 4);
  r.status = std::stoi(r.head.substr(9, 3));
  for (size_t pos = r.head.find("\r\n") + 2; pos < r.head.size();) {
    const size_t eol = r.head.find("\r\n", pos);
    const std::string line = r.head.substr(pos, eol - pos);
    const size_t colon = line.find(':');
    std::string name = line.substr(0, colon);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
    pos = eol + 2;
  }
  return r;
}

inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace tlsprof::http::testing
