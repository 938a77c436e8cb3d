#include "cli.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <utility>

#include <kvoffload/error.hpp>
#include <kvoffload/region.hpp>

namespace kvoffload::cli {

std::map<std::string, CommandSetup>& command_registry() {
  static std::map<std::string, CommandSetup> registry;
  return registry;
}

CommandRegistrar::CommandRegistrar(std::string name, CommandSetup setup) {
  command_registry().emplace(std::move(name), std::move(setup));
}

std::uint64_t parse_size(std::string_view flag, std::string_view text) {
  auto fail = [&](std::string_view why) -> std::uint64_t {
    throw_invalid(std::string(flag) + " '" + std::string(text) + "': " + std::string(why) +
                  "; use plain bytes or a K/M/G/T suffix (powers of two), e.g. 4096, 64K, 2G");
  };
  if (text.empty()) return fail("empty size");
  const auto digits_end = std::find_if_not(text.begin(), text.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) != 0;
  });
  if (digits_end == text.begin()) return fail("not a number");
  const std::string suffix(digits_end, text.end());
  // CLI11's AsSizeValue(false) reads the number and the unit, K = 1024 (not 1000), any case, with
  // an optional "B" or "iB". It throws ValidationError both for an unknown unit and for a product
  // that overflows, so the unit is tried alone first to tell the two apart.
  const CLI::AsSizeValue as_size(/*kb_is_1000=*/false);
  if (!suffix.empty()) {
    const bool letters_only = std::all_of(suffix.begin(), suffix.end(), [](char c) {
      return std::isalpha(static_cast<unsigned char>(c)) != 0;
    });
    std::string upper;
    for (char c : suffix) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    // CLI11 also knows E and P; the help and every message offer K/M/G/T, so only those are
    // accepted (with an optional B or iB), and a lone B.
    std::string_view unit = upper;
    if (unit.ends_with("IB") && unit.size() == 3) {
      unit.remove_suffix(2);
    } else if (unit.ends_with("B")) {
      unit.remove_suffix(1);
    }
    const bool known = unit.empty() || unit == "K" || unit == "M" || unit == "G" || unit == "T";
    std::string unit_alone = "1" + suffix;
    try {
      if (!letters_only || !known) throw CLI::ValidationError("not a unit");
      (void)as_size(unit_alone);
    } catch (const CLI::ValidationError&) {
      return fail("unknown suffix '" + upper + "'");
    }
  }
  std::string converted(text);
  try {
    (void)as_size(converted);
  } catch (const CLI::ValidationError&) {
    return fail("too large");  // the digits, or digits x unit, do not fit in 64 bits
  }
  std::uint64_t value = 0;
  const auto [end, ec] =
      std::from_chars(converted.data(), converted.data() + converted.size(), value);
  if (ec != std::errc{} || end != converted.data() + converted.size()) return fail("too large");
  return value;
}

std::string format_count(std::uint64_t value) {
  if (value == std::numeric_limits<std::uint64_t>::max()) return "2^64-1";
  if (value >= (1ULL << 16) && std::has_single_bit(value)) {
    return "2^" + std::to_string(std::countr_zero(value));
  }
  if (value >= (1ULL << 16) && std::has_single_bit(value + 1)) {
    return "2^" + std::to_string(std::countr_zero(value + 1)) + "-1";
  }
  return std::to_string(value);
}

std::string format_size(std::uint64_t bytes) {
  static constexpr const char* kSuffixes[] = {"T", "G", "M", "K"};
  for (int i = 0; i < 4; ++i) {
    const unsigned shift = 40U - 10U * static_cast<unsigned>(i);
    if (bytes != 0 && bytes % (1ULL << shift) == 0) {
      return std::to_string(bytes >> shift) + kSuffixes[i];
    }
  }
  return format_count(bytes);
}

CLI::Option* add_size_option(CLI::App& app, const std::string& name, std::uint64_t& out,
                             const std::string& description, std::uint64_t lo, std::uint64_t hi) {
  const std::string flag = name.substr(0, name.find(','));
  return app
      .add_option_function<std::string>(
          name,
          [&out, flag, lo, hi](const std::string& text) {
            const std::uint64_t value = parse_size(flag, text);
            if (value < lo || value > hi) {
              throw_invalid(flag + ": " + text + " is out of range; allowed " + format_size(lo) +
                            " to " + format_size(hi) + " bytes");
            }
            out = value;
          },
          description)
      ->type_name("SIZE");
}

CLI::Validator engine_id_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          (void)region_path("/", text);  // the one rule for engine ids
        } catch (const Error& e) {
          return e.what();
        }
        return {};
      },
      "ID");
}

CLI::Validator whole_range(std::uint64_t lo, std::uint64_t hi) {
  const std::string range = format_count(lo) + " to " + format_count(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        std::string_view digits = text;
        const bool negative = !digits.empty() && digits.front() == '-';
        if (negative) digits.remove_prefix(1);
        const bool numeric =
            !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) {
              return std::isdigit(static_cast<unsigned char>(c)) != 0;
            });
        if (!numeric) return "'" + text + "' is not a whole number; allowed " + range;
        std::uint64_t value = 0;
        const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
        if (negative || ec != std::errc{} || value < lo || value > hi) {
          return text + " is out of range; allowed " + range;
        }
        return {};
      },
      range);
}

CLI::Validator real_range(double lo, double hi, const std::string& unit) {
  auto bound = [](double v) {
    char buf[32];
    (void)std::snprintf(buf, sizeof buf, "%.15g", v);
    return std::string(buf);
  };
  const std::string range = bound(lo) + " to " + bound(hi) + " " + unit;
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double value = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || std::isnan(value)) {
          return "'" + text + "' is not a number; allowed " + range;
        }
        if (errno == ERANGE || !(value >= lo && value <= hi)) {
          return text + " is out of range; allowed " + range;
        }
        return {};
      },
      range);
}

void emit(bool json, const nlohmann::json& object, const std::string& human_text) {
  if (json) {
    std::cout << object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  } else {
    std::cout << human_text;
    if (!human_text.empty() && human_text.back() != '\n') std::cout << '\n';
    std::cout.flush();
  }
}

nlohmann::json error_object(std::string_view code, std::string_view message, int exit_code,
                            int sys_errno, std::string_view call) {
  nlohmann::json error{{"code", code}, {"message", printable(message)}, {"exit_code", exit_code}};
  if (sys_errno != 0) error["errno"] = errno_name(sys_errno);
  if (!call.empty()) error["call"] = call;
  return nlohmann::json{{"error", std::move(error)}};
}

int emit_failure(bool json, nlohmann::json report, const std::string& human_text,
                 std::string_view code, const std::string& message, int exit_code) {
  if (json) report.update(error_object(code, message, exit_code));
  emit(json, report, human_text);
  std::cerr << "kvoffload: " << printable(message) << "\n";
  return exit_code;
}

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto escape = [&out](unsigned char c) {
    static constexpr char kHex[] = "0123456789abcdef";
    out += "\\x";
    out += kHex[c >> 4U];
    out += kHex[c & 15U];
  };
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  const auto cont = [&](std::size_t i, unsigned char lo = 0x80, unsigned char hi = 0xBF) {
    return i < n && p[i] >= lo && p[i] <= hi;
  };
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7F)) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    // The length of a well-formed UTF-8 sequence starting here (RFC 3629 table), 0 if none.
    // C1 controls (U+0080..U+009F: C2 80..C2 9F) are control characters too.
    std::size_t len = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      len = cont(i + 1, c == 0xC2 ? 0xA0 : 0x80) ? 2 : 0;
    } else if (c >= 0xE0 && c <= 0xEF) {
      const unsigned char lo = c == 0xE0 ? 0xA0 : 0x80;
      const unsigned char hi = c == 0xED ? 0x9F : 0xBF;
      len = cont(i + 1, lo, hi) && cont(i + 2) ? 3 : 0;
    } else if (c >= 0xF0 && c <= 0xF4) {
      const unsigned char lo = c == 0xF0 ? 0x90 : 0x80;
      const unsigned char hi = c == 0xF4 ? 0x8F : 0xBF;
      len = cont(i + 1, lo, hi) && cont(i + 2) && cont(i + 3) ? 4 : 0;
    }
    if (len == 0) {
      escape(c);
      ++i;
    } else {
      out.append(text.substr(i, len));
      i += len;
    }
  }
  return out;
}

nlohmann::json backends_json(const std::vector<BackendInfo>& backends) {
  nlohmann::json items = nlohmann::json::array();
  for (const BackendInfo& b : backends) {
    items.push_back({{"name", b.name},
                     {"built", b.built},
                     {"device_count", b.device_count},
                     {"detail", b.detail}});
  }
  return items;
}

std::string backends_text(const std::vector<BackendInfo>& backends) {
  std::string text;
  for (const BackendInfo& b : backends) {
    // An unbuilt backend's detail already says why it is not built.
    if (b.built) {
      text += "  " + b.name + ": " + std::to_string(b.device_count) +
              (b.device_count == 1 ? " device" : " devices") +
              (b.detail.empty() ? std::string() : " (" + b.detail + ")") + "\n";
    } else {
      text +=
          "  " + b.name + ": " + (b.detail.empty() ? std::string("not built") : b.detail) + "\n";
    }
  }
  return text;
}

std::string human_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 5) {
    v /= 1024.0;
    ++unit;
  }
  char buf[64];
  (void)std::snprintf(buf, sizeof(buf), unit == 0 ? "%.0f %s" : "%.2f %s", v, kUnits[unit]);
  return buf;
}

}  // namespace kvoffload::cli
