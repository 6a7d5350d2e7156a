// SPDX-License-Identifier: Apache-2.0
// regroup-sim: runs the deterministic simulation of the control protocol (world.h) over seeds.
//
//   regroup-sim --seeds 2000            seeds 1 to 2000; prints each failure and a replay line
//   regroup-sim --seed 1234 --trace     replays one seed, printing every event
//   regroup-sim --hours 2               the long mode: fresh seeds until the time is up; without
//                                       --faults, one run in four is a dense schedule (12
//                                       faults), reported on its own line
//   regroup-sim --seeds 2000 --gaps     also names each seed with a census gap or a state lost,
//                                       and its replay line
//
// Exits 1 when any seed breaks an invariant.
#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include <CLI/CLI.hpp>

#include "common/version.h"
#include "sim/world.h"

int main(int argc, char** argv) {
  CLI::App app{"regroup-sim: deterministic simulation of Regroup's control protocol"};
  app.set_version_flag("--version", std::string("regroup-sim ") + REGROUP_VERSION_STRING,
                       "print the version and exit");
  uint64_t seed = 0, seeds = 0, from = 1;
  double hours = 0;
  regroup::sim::Options base;
  app.add_option("--seed", seed, "run this one seed (with --trace: every event)");
  app.add_option("--seeds", seeds, "run this many seeds, from --from");
  app.add_option("--from", from, "the first seed of --seeds")->check(CLI::PositiveNumber);
  app.add_option("--hours", hours, "the long mode: run fresh seeds for this many hours")
      ->check(CLI::Range(0.0, 1000.0));
  app.add_option("--faults", base.faults, "faults per run (default: drawn, 0 to 6)")
      ->check(CLI::Range(0, 1000));
  app.add_option("--menu", base.menu,
                 "fault kinds to draw from (default: all; crash_coordinator, cut_coordinator "
                 "and pause_coordinator need --coordinator; unrecorded_manager, a second "
                 "manager started without --record, and kill_agent_at_plan, a pod killed as a "
                 "plan reaches it, are drawn only when named)")
      ->delimiter(',')
      ->check(CLI::IsMember([] {
        std::vector<std::string> kinds = regroup::sim::CoordinatorFaultKinds();
        for (const auto& k : regroup::sim::MenuOnlyFaultKinds()) kinds.push_back(k);
        return kinds;
      }()));
  app.add_flag("--coordinator", base.coordinator,
               "the coordinator decides, as under Volcano: managers attach to it, are granted "
               "their epochs there and commit under its lease; its crash, cut and pause join "
               "the menu");
  app.add_flag("--accept-no-record", base.accept_no_record,
               "an unrecorded_manager's launcher passes --no-record: it runs beside the first, "
               "fenced by nothing");
  app.add_flag("--trace", base.trace, "print every event");
  bool gaps = false;
  app.add_flag("--gaps", gaps,
               "name each seed whose run had a census gap or a state_lost fault, with its replay "
               "line");
  CLI11_PARSE(app, argc, argv);
  if ((seed != 0) + (seeds != 0) + (hours != 0) != 1) {
    std::fprintf(stderr, "regroup-sim: give exactly one of --seed N, --seeds N or --hours H\n");
    return 2;
  }

  const auto start = std::chrono::steady_clock::now();
  const auto until = start + std::chrono::duration<double, std::ratio<3600>>(hours);
  // Figures per band of schedules: the faults drawn (0 to 6, or --faults), and in the long mode
  // the dense one.
  struct Band {
    uint64_t ran = 0, failed = 0, events = 0, census_gaps = 0, gapped_seeds = 0, lost_seeds = 0;
    std::map<std::string, uint64_t> outcomes;
  };
  constexpr int kDenseFaults = 12;
  std::map<std::string, Band> bands;
  auto run_one = [&](uint64_t s, int faults) {
    regroup::sim::Options o = base;
    o.seed = s;
    o.faults = faults;
    const auto r = regroup::sim::Run(o);
    Band& band = bands[faults == base.faults ? "" : "dense (" + std::to_string(faults) + " faults)"];
    ++band.ran;
    band.events += r.events;
    band.census_gaps += r.census_gaps;
    band.gapped_seeds += r.census_gaps > 0;
    band.lost_seeds += r.state_lost > 0;
    if (r.ok) {
      ++band.outcomes[r.outcome.substr(0, r.outcome.find(':'))];
      if (seed)
        std::printf("seed %llu: ok at %lld ms: %s; %s; census gaps %llu; state lost %llu\n",
                    (unsigned long long)s, (long long)r.at_ms, r.setup.c_str(),
                    r.outcome.c_str(), (unsigned long long)r.census_gaps,
                    (unsigned long long)r.state_lost);
      else if (gaps && (r.census_gaps || r.state_lost))
        std::printf("seed %llu: census gaps %llu, state lost %llu: %s\n  replay: %s\n",
                    (unsigned long long)s, (unsigned long long)r.census_gaps,
                    (unsigned long long)r.state_lost, r.setup.c_str(), regroup::sim::ReplayLine(o).c_str());
      return;
    }
    ++band.failed;
    std::printf("seed %llu FAILED at %lld ms: %s\n  job: %s\n", (unsigned long long)s,
                (long long)r.at_ms, r.violation.c_str(), r.setup.c_str());
    if (!base.trace) {
      std::printf("  last events:\n");
      for (const auto& line : r.trace) std::printf("    %s\n", line.c_str());
    }
    std::printf("  replay: %s\n", regroup::sim::ReplayLine(o).c_str());
  };
  if (seed) run_one(seed, base.faults);
  for (uint64_t s = from; seeds && s < from + seeds; ++s) run_one(s, base.faults);
  // The long mode draws its seeds from the time it started, so every run explores new ones.
  uint64_t long_runs = 0;
  for (uint64_t s = static_cast<uint64_t>(start.time_since_epoch().count()) | 1;
       hours > 0 && std::chrono::steady_clock::now() < until; s += 2)
    run_one(s, base.faults < 0 && ++long_runs % 4 == 0 ? kDenseFaults : base.faults);

  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  uint64_t failed = 0;
  for (const auto& [name, b] : bands) {
    failed += b.failed;
    std::printf("regroup-sim%s%s: %llu seeds, %llu failed, %llu events", name.empty() ? "" : " ",
                name.c_str(), (unsigned long long)b.ran, (unsigned long long)b.failed,
                (unsigned long long)b.events);
    if (name.empty()) std::printf(" in %.1f s", secs);
    std::printf(";");
    for (const auto& [kind, n] : b.outcomes)
      std::printf(" %s %llu", kind.c_str(), (unsigned long long)n);
    std::printf("; census gaps %llu in %llu seeds; state lost in %llu seeds\n",
                (unsigned long long)b.census_gaps, (unsigned long long)b.gapped_seeds,
                (unsigned long long)b.lost_seeds);
  }
  return failed ? 1 : 0;
}
