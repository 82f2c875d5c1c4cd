// One JSON object per line, written by hand (the benchmark takes no JSON dependency).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace mlakit::bench {

// Builds `{"key": value, ...}` in insertion order. Distinct method names instead of
// overloads, so a string literal can never silently become a bool.
class JsonLine {
 public:
  JsonLine& text(const char* key, const std::string& value);
  JsonLine& number(const char* key, double value);                        // NaN or infinity -> null
  JsonLine& number(const char* key, const std::optional<double>& value);  // empty -> null
  JsonLine& integer(const char* key, int64_t value);
  JsonLine& boolean(const char* key, bool value);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  JsonLine& raw(const char* key, const std::string& json_value);
  std::string body_;
};

// `name` with every character outside [A-Za-z0-9._-] replaced by '_' (a file name).
std::string sanitize_file_name(const std::string& name);

// The current time in UTC, e.g. "2026-11-22T14:03:59Z".
std::string utc_now_iso8601();

// Appends `line` and a newline to `path`; false when the file cannot be written.
bool append_line(const std::string& path, const std::string& line);

}  // namespace mlakit::bench
