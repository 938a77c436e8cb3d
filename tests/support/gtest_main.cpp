// The main of every GoogleTest suite (instead of gtest_main): runs the tests, then says how many
// cases ran and how many were skipped and why, and applies the CI skip policy.
//
// Note [Skips in CI]
// ~~~~~~~~~~~~~~~~~~
// A skipped test passes in ctest's eyes, so a suite whose servers, privileges or device are
// missing used to report "passed" while testing nothing. Now:
//   - a skip names its reason: KVO_SKIP("tag") << detail (tests/support/skip.hpp) makes the
//     message "[tag] detail"; pytest skips use the same "[tag] detail" form;
//   - tests/accepted_skips.txt lists the tags CI accepts (one place, read here and by
//     python/tests/conftest.py);
//   - with KVOFFLOAD_CI_NO_SKIPS=1 (.ci/run exports it) a skip whose tag is not accepted, or that
//     has no tag at all, makes the suite exit 1 after naming it;
//   - every suite prints "<suite>: N cases ran, M skipped" and each skip with its reason, and
//     when KVOFFLOAD_TEST_REPORT_DIR is set (ctest sets it, see tests/CMakeLists.txt) writes the
//     same as <suite>.json there; tools/ci/test_summary.py adds the suites and pytest up for the
//     README's test command.

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <gtest/gtest.h>

#ifndef KVOFFLOAD_ACCEPTED_SKIPS_FILE
#error "KVOFFLOAD_ACCEPTED_SKIPS_FILE must name tests/accepted_skips.txt"
#endif

namespace {

struct Skip {
  std::string test;
  std::string message;
  std::string tag;  // "" when the message does not start with "[tag]"
};

// "[tag] detail" -> "tag"; anything else -> "".
std::string tag_of(const std::string& message) {
  if (message.size() < 3 || message.front() != '[') return {};
  const auto end = message.find(']');
  if (end == std::string::npos || end == 1) return {};
  return message.substr(1, end - 1);
}

class SkipRecorder : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const ::testing::TestResult& r = *info.result();
    if (!r.Skipped()) return;
    Skip s;
    s.test = std::string(info.test_suite_name()) + "." + info.name();
    for (int i = 0; i < r.total_part_count(); ++i) {
      const ::testing::TestPartResult& p = r.GetTestPartResult(i);
      if (p.skipped()) {
        s.message = p.message();
        break;
      }
    }
    s.tag = tag_of(s.message);
    skips.push_back(std::move(s));
  }
  std::vector<Skip> skips;
};

// The tags of tests/accepted_skips.txt (first word of each line that is not blank or a comment).
bool read_accepted(std::set<std::string>& out, std::string& error) {
  std::ifstream in(KVOFFLOAD_ACCEPTED_SKIPS_FILE);
  if (!in) {
    error =
        std::string("cannot read ") + KVOFFLOAD_ACCEPTED_SKIPS_FILE + ": " + std::strerror(errno);
    return false;
  }
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string tag;
    if (words >> tag && tag[0] != '#') out.insert(tag);
  }
  return true;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          (void)std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string suite_name(const char* argv0) {
  const char* slash = std::strrchr(argv0, '/');
  return slash != nullptr ? slash + 1 : argv0;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto* recorder = new SkipRecorder();  // owned by the listener list
  ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  unit.listeners().Append(recorder);
  int rc = RUN_ALL_TESTS();

  const char* ci_env = std::getenv("KVOFFLOAD_CI_NO_SKIPS");
  const bool ci = ci_env != nullptr && std::strcmp(ci_env, "1") == 0;
  std::set<std::string> accepted;
  std::string policy_error;
  const bool have_policy = read_accepted(accepted, policy_error);

  const std::string suite = suite_name(argv[0]);
  const int ran = unit.successful_test_count() + unit.failed_test_count();
  std::printf("%s: %d cases ran (%d failed), %d skipped\n", suite.c_str(), ran,
              unit.failed_test_count(), unit.skipped_test_count());
  int refused = 0;
  std::string json_skips;
  for (const Skip& s : recorder->skips) {
    const bool ok = have_policy && !s.tag.empty() && accepted.count(s.tag) != 0;
    const char* verdict = ok              ? "accepted in CI"
                          : s.tag.empty() ? "no reason tag: not accepted in CI"
                                          : "not accepted in CI";
    std::printf("  skipped %s: %s (%s)\n", s.test.c_str(), s.message.c_str(), verdict);
    if (!ok) ++refused;
    if (!json_skips.empty()) json_skips += ",";
    json_skips += "{\"test\":" + json_string(s.test) + ",\"tag\":" + json_string(s.tag) +
                  ",\"message\":" + json_string(s.message) +
                  ",\"accepted\":" + (ok ? "true" : "false") + "}";
  }
  if (ci && refused > 0) {
    std::printf(
        "%s: %d skip(s) without a reason CI accepts (KVOFFLOAD_CI_NO_SKIPS=1; accepted: %s)%s%s\n",
        suite.c_str(), refused, KVOFFLOAD_ACCEPTED_SKIPS_FILE, have_policy ? "" : ": ",
        have_policy ? "" : policy_error.c_str());
    rc = 1;
  }
  if (const char* dir = std::getenv("KVOFFLOAD_TEST_REPORT_DIR"); dir != nullptr && *dir != '\0') {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::ofstream out(std::filesystem::path(dir) / (suite + ".json"));
    out << "{\"runner\":\"gtest\",\"suite\":" << json_string(suite) << ",\"ran\":" << ran
        << ",\"failed\":" << unit.failed_test_count()
        << ",\"skipped\":" << unit.skipped_test_count() << ",\"skips\":[" << json_skips << "]}\n";
  }
  (void)std::fflush(stdout);
  return rc;
}
