// tools/veloxquant/subcommand.h — how subcommands plug into the `veloxquant` command line.
//
// Each subcommand is one .cpp file in tools/veloxquant/ that defines a Command and registers it
// with VQ_REGISTER_COMMAND; main.cpp never names them. The registrar runs at static
// initialisation (the files are compiled into the executable, not an archive, so they are
// always linked). A new subcommand is a new file: nothing else changes.
//
//   class GenerateCommand final : public vqcli::Command {
//    public:
//     void configure(CLI::App& app) override { app.add_option("--model", model_)->required(); }
//     int run() override { ...; return 0; }
//    private:
//     std::string model_;
//   };
//   VQ_REGISTER_COMMAND(GenerateCommand, "generate", "Generate text with a compressed KV cache");
//
// run() reports user errors by throwing (veloxquant::Error or std::exception); main prints
// "veloxquant: error: <message>" and exits with status 1. Command-line parse errors exit 2.
//
// Calibration input sources plug in the same way (KvSource below): `calibrate --kv FILE` is
// one; a source that runs a model (`--model DIR`) registers itself with VQ_REGISTER_KV_SOURCE
// from its own file and is offered by `calibrate` automatically.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "veloxquant/calibrate.h"

namespace vqcli {

class Command {
 public:
  virtual ~Command() = default;
  /// Adds this command's options and positionals to its (sub)app.
  virtual void configure(CLI::App& app) = 0;
  /// Runs after a successful parse; returns the exit status.
  virtual int run() = 0;
};

struct CommandInfo {
  std::string name;
  std::string help;
  std::function<std::unique_ptr<Command>()> make;
};

/// Adds a command to the registry (called by VQ_REGISTER_COMMAND). Returns true.
bool register_command(CommandInfo info);
/// Every registered command, sorted by name.
std::vector<CommandInfo> registered_commands();

/// A source of calibration KV samples for `veloxquant calibrate`.
class KvSource {
 public:
  virtual ~KvSource() = default;
  /// Adds the source's options to the calibrate app (e.g. "--kv", "--model").
  virtual void configure(CLI::App& app) = 0;
  /// Whether the user chose this source (one of its options was given).
  virtual bool selected() const = 0;
  /// A short description for errors ("--kv FILE").
  virtual std::string usage() const = 0;
  /// Produces the samples; max_tokens > 0 caps the tokens per layer.
  virtual veloxquant::KVSamples load(int64_t max_tokens) = 0;
};

struct KvSourceInfo {
  std::string name;
  std::function<std::unique_ptr<KvSource>()> make;
};
bool register_kv_source(KvSourceInfo info);
std::vector<KvSourceInfo> registered_kv_sources();

}  // namespace vqcli

#define VQ_CLI_CONCAT2(a, b) a##b
#define VQ_CLI_CONCAT(a, b) VQ_CLI_CONCAT2(a, b)

/// Registers `Class` (default-constructible, derived from vqcli::Command) as subcommand `name`.
#define VQ_REGISTER_COMMAND(Class, name, help)                                                   \
  namespace {                                                                                    \
  [[maybe_unused]] const bool VQ_CLI_CONCAT(vq_registered_command_, __LINE__) =                   \
      ::vqcli::register_command({name, help, [] { return std::unique_ptr<::vqcli::Command>(new Class()); }}); \
  }

/// Registers `Class` (derived from vqcli::KvSource) as a calibration input source.
#define VQ_REGISTER_KV_SOURCE(Class, name)                                                       \
  namespace {                                                                                    \
  [[maybe_unused]] const bool VQ_CLI_CONCAT(vq_registered_kv_source_, __LINE__) =                 \
      ::vqcli::register_kv_source({name, [] { return std::unique_ptr<::vqcli::KvSource>(new Class()); }}); \
  }
