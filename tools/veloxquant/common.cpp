// Shared CLI helpers and the command / KV-source registries.
#include "common.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "subcommand.h"
#include "veloxquant/error.h"

namespace vqcli {

// ---- registries -----------------------------------------------------------------------------

static std::vector<CommandInfo>& command_registry() {
  static std::vector<CommandInfo> r;
  return r;
}
bool register_command(CommandInfo info) {
  command_registry().push_back(std::move(info));
  return true;
}
std::vector<CommandInfo> registered_commands() {
  auto r = command_registry();
  std::sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return r;
}

static std::vector<KvSourceInfo>& kv_source_registry() {
  static std::vector<KvSourceInfo> r;
  return r;
}
bool register_kv_source(KvSourceInfo info) {
  kv_source_registry().push_back(std::move(info));
  return true;
}
std::vector<KvSourceInfo> registered_kv_sources() {
  auto r = kv_source_registry();
  std::sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return r;
}

// ---- progress -------------------------------------------------------------------------------

bool stderr_is_tty() { return ::isatty(STDERR_FILENO) == 1; }

ProgressBar::ProgressBar(std::string label, bool enabled)
    : label_(std::move(label)), enabled_(enabled), start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() {
  if (enabled_ && !finished_) std::fputc('\n', stderr);
}

void ProgressBar::update(double fraction, const std::string& status) {
  if (!enabled_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  draw(fraction, status);
}

void ProgressBar::finish(const std::string& status) {
  if (!enabled_ || finished_) return;
  draw(1.0, status);
  std::fputc('\n', stderr);
  finished_ = true;
}

void ProgressBar::draw(double fraction, const std::string& status) {
  constexpr int kWidth = 30;
  fraction = std::clamp(fraction, 0.0, 1.0);
  const int filled = int(fraction * kWidth + 0.5);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string bar(size_t(filled), '#');
  bar.append(size_t(kWidth - filled), '.');
  std::fprintf(stderr, "\r\033[K%s [%s] %3d%% %5.1fs %s", label_.c_str(), bar.c_str(), int(fraction * 100 + 0.5),
               secs, status.c_str());
  std::fflush(stderr);
}

// ---- tables ---------------------------------------------------------------------------------

Table::Table(std::vector<std::string> header) : header_(std::move(header)) {}

void Table::add_row(std::vector<std::string> row) {
  row.resize(header_.size());
  rows_.push_back(std::move(row));
}

void Table::print(FILE* out) const {
  std::vector<size_t> w(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) {
    w[c] = header_[c].size();
    for (const auto& r : rows_) w[c] = std::max(w[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& r) {
    for (size_t c = 0; c < r.size(); ++c) {
      // First column left-aligned (names), the rest right-aligned (numbers).
      if (c == 0)
        std::fprintf(out, "%-*s", int(w[c]), r[c].c_str());
      else
        std::fprintf(out, "  %*s", int(w[c]), r[c].c_str());
    }
    std::fputc('\n', out);
  };
  line(header_);
  size_t total = 0;
  for (size_t c = 0; c < w.size(); ++c) total += w[c] + (c ? 2 : 0);
  std::fprintf(out, "%s\n", std::string(total, '-').c_str());
  for (const auto& r : rows_) line(r);
}

// ---- formatting -----------------------------------------------------------------------------

std::string strf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char buf[512];
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return {};
  if (size_t(n) < sizeof buf) return std::string(buf, size_t(n));
  std::string s(size_t(n) + 1, '\0');
  va_start(ap, fmt);
  std::vsnprintf(s.data(), s.size(), fmt, ap);
  va_end(ap);
  s.resize(size_t(n));
  return s;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  return u == 0 ? strf("%.0f %s", b, units[u]) : strf("%.2f %s", b, units[u]);
}

void write_json(const nlohmann::json& j, const std::string& path) {
  const std::string text = j.dump(2) + "\n";
  if (path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
  }
  std::ofstream f(path, std::ios::binary);
  if (!f) VQ_THROW(IoError, "cannot write '" << path << "': " << std::strerror(errno));
  f << text;
  if (!f) VQ_THROW(IoError, "cannot write '" << path << "'");
}

}  // namespace vqcli
