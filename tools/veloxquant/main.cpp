// veloxquant — the command line. Subcommands register themselves (subcommand.h); main only
// parses, dispatches, and turns exceptions into "veloxquant: error: ..." with a non-zero status.
#include <cstdio>
#include <exception>
#include <memory>
#include <vector>

#include <CLI/CLI.hpp>

#include "subcommand.h"
#include "veloxquant/error.h"

#ifndef VQ_VERSION
#define VQ_VERSION "unknown"
#endif

int main(int argc, char** argv) {
  CLI::App app{"veloxquant: VecInfer KV-cache compression (smooth + Hadamard keys, product VQ, "
               "attention on the codes)",
               "veloxquant"};
  app.set_version_flag("--version", "veloxquant " VQ_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);

  std::vector<std::pair<CLI::App*, std::unique_ptr<vqcli::Command>>> commands;
  for (const auto& info : vqcli::registered_commands()) {
    CLI::App* sub = app.add_subcommand(info.name, info.help);
    auto cmd = info.make();
    cmd->configure(*sub);
    commands.emplace_back(sub, std::move(cmd));
  }

  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const auto& [sub, cmd] : commands) known |= sub->get_name() == argv[1];
    if (!known) {
      std::fprintf(stderr, "veloxquant: error: unknown command '%s'\n", argv[1]);
      std::fprintf(stderr, "Run 'veloxquant --help' for the list of commands.\n");
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "veloxquant: error: %s\n", e.what());
    std::fprintf(stderr, "Run 'veloxquant --help' or 'veloxquant <command> --help' for usage.\n");
    return 2;
  }

  try {
    for (auto& [sub, cmd] : commands)
      if (sub->parsed()) return cmd->run();
  } catch (const veloxquant::Error& e) {
    std::fprintf(stderr, "veloxquant: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "veloxquant: error: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "veloxquant: error: no command given\n");
  return 2;
}
