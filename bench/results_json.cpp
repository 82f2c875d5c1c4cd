#include "bench/results_json.h"

#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>

namespace mlakit::bench {
namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

}  // namespace

JsonLine& JsonLine::raw(const char* key, const std::string& json_value) {
  if (!body_.empty()) body_ += ", ";
  body_ += quoted(key) + ": " + json_value;
  return *this;
}

JsonLine& JsonLine::text(const char* key, const std::string& value) {
  return raw(key, quoted(value));
}

JsonLine& JsonLine::number(const char* key, double value) {
  if (!std::isfinite(value)) return raw(key, "null");
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", value);  // 10 digits: sub-nanosecond for times
  return raw(key, buf);
}

JsonLine& JsonLine::number(const char* key, const std::optional<double>& value) {
  return value ? number(key, *value) : raw(key, "null");
}

JsonLine& JsonLine::integer(const char* key, int64_t value) {
  return raw(key, std::to_string(value));
}

JsonLine& JsonLine::boolean(const char* key, bool value) {
  return raw(key, value ? "true" : "false");
}

std::string sanitize_file_name(const std::string& name) {
  std::string out = name;
  for (char& ch : out) {
    const bool keep = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
                      (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    if (!keep) ch = '_';
  }
  return out;
}

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buf;
}

bool append_line(const std::string& path, const std::string& line) {
  std::ofstream file(path, std::ios::app);
  file << line << '\n';
  file.flush();
  return static_cast<bool>(file);
}

}  // namespace mlakit::bench
