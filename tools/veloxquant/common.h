// tools/veloxquant/common.h — helpers shared by the subcommands: progress bars, tables, JSON.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vqcli {

/// Whether stderr is a terminal.
bool stderr_is_tty();

/// A one-line progress bar on stderr, redrawn in place at most ~10 times a second. Disabled
/// (prints nothing) unless `enabled`; callers pass `--progress || stderr_is_tty()`, so CI
/// logs never get a stream of carriage returns.
class ProgressBar {
 public:
  ProgressBar(std::string label, bool enabled);
  ~ProgressBar();
  /// fraction in [0, 1]; `status` is shown after the bar.
  void update(double fraction, const std::string& status = "");
  /// Draws 100% with `status` and ends the line.
  void finish(const std::string& status = "");

 private:
  void draw(double fraction, const std::string& status);
  std::string label_;
  bool enabled_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point last_{};
  std::chrono::steady_clock::time_point start_;
};

/// A plain-text table with right-aligned numeric columns.
class Table {
 public:
  explicit Table(std::vector<std::string> header);
  void add_row(std::vector<std::string> row);
  /// Writes the table with a header rule; columns padded to their widest cell.
  void print(FILE* out = stdout) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

/// printf-style formatting into a std::string.
std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
/// "1.23 MiB", "512 B", ...
std::string human_bytes(double bytes);
/// Writes `j` (pretty, newline-terminated) to `path`, or to stdout when path is "-".
/// Throws veloxquant::IoError when the file cannot be written.
void write_json(const nlohmann::json& j, const std::string& path);

}  // namespace vqcli
