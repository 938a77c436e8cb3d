#include "cli.hpp"

#include <kvoffload/error.hpp>

#include <cctype>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <utility>

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
  std::size_t i = 0;
  std::uint64_t value = 0;
  if (text.empty()) return fail("empty size");
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) != 0) {
    const std::uint64_t digit = static_cast<std::uint64_t>(text[i] - '0');
    if (value > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) return fail("too large");
    value = value * 10 + digit;
    ++i;
  }
  if (i == 0) return fail("not a number");
  std::string suffix;
  for (; i < text.size(); ++i) suffix += static_cast<char>(std::toupper(static_cast<unsigned char>(text[i])));
  unsigned shift = 0;
  if (suffix.empty() || suffix == "B") shift = 0;
  else if (suffix == "K" || suffix == "KB" || suffix == "KIB") shift = 10;
  else if (suffix == "M" || suffix == "MB" || suffix == "MIB") shift = 20;
  else if (suffix == "G" || suffix == "GB" || suffix == "GIB") shift = 30;
  else if (suffix == "T" || suffix == "TB" || suffix == "TIB") shift = 40;
  else return fail("unknown suffix '" + suffix + "'");
  if (shift != 0 && value > (std::numeric_limits<std::uint64_t>::max() >> shift)) return fail("too large");
  return value << shift;
}

CLI::Option* add_size_option(CLI::App& app, const std::string& name, std::uint64_t& out,
                             const std::string& description) {
  const std::string flag = name.substr(0, name.find(','));
  return app
      .add_option_function<std::string>(
          name, [&out, flag](const std::string& text) { out = parse_size(flag, text); }, description)
      ->type_name("SIZE");
}

void emit(bool json, const nlohmann::json& object, const std::string& human_text) {
  if (json) {
    std::cout << object.dump() << std::endl;
  } else {
    std::cout << human_text;
    if (!human_text.empty() && human_text.back() != '\n') std::cout << '\n';
    std::cout.flush();
  }
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
  std::snprintf(buf, sizeof(buf), unit == 0 ? "%.0f %s" : "%.2f %s", v, kUnits[unit]);
  return buf;
}

}  // namespace kvoffload::cli
