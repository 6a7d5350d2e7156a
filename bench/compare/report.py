#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Tables and plots of the comparison from results/*.jsonl; fills the block between
`<!-- results:begin -->` and `<!-- results:end -->` of bench/compare/README.md.

    /usr/bin/python3 bench/compare/report.py [--results bench/compare/results] [--no-readme]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import HERE, changed_lines, machine, median, read_jsonl  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FAULTS = [("trainer", "a trainer process killed"), ("node", "a node killed, no spare (continue smaller)"),
          ("return", "the node returns (back to full size)")]
LABEL = {"regroup": "Regroup", "torchrun-ckpt10": "torchrun, checkpoint every 10 steps",
         "torchrun-ckpt1": "torchrun, checkpoint every step"}


SHORT = {"regroup": "Regroup", "torchrun-ckpt10": "torchrun\nckpt / 10 steps", "torchrun-ckpt1": "torchrun\nckpt / step"}


def f(x, digits=2, unit=""):
    if x is None:
        return "n/a"
    if isinstance(x, float):
        if abs(x) >= 100:
            return f"{x:.0f}{unit}"
        return f"{x:.{digits}f}{unit}"
    return f"{x}{unit}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "n/a"
    r = a / b
    return f"{r:.3f}" if r < 0.1 else f"{r:.2f}"


# ------------------------------------------------------------------------------------------------
# Part A
# ------------------------------------------------------------------------------------------------


def scale_section(rows, outdir: Path) -> str:
    reg = defaultdict(list)
    tor = defaultdict(list)
    spread = defaultdict(list)
    for r in rows:
        if r.get("system") == "regroup":
            reg[r["nodes"]].append(r)
        elif r.get("system") == "torch-c10d" and r.get("procs", r.get("participant_processes", 1)) == 1:
            tor[(r["nodes"], r.get("last_call_s", 1))].append(r)
        elif r.get("system") == "torch-c10d":
            spread[(r["nodes"], r.get("procs", r.get("participant_processes")))].append(r)

    def med(rs, *path):
        vals = []
        for r in rs:
            v = r
            for p in path:
                v = v.get(p) if isinstance(v, dict) else None
            if isinstance(v, (int, float)):
                vals.append(float(v))
        return median(vals)

    def ok(rs, phase):
        return [r for r in rs if r.get(phase, {}).get("ok")]

    def torch_cell(rs, phase):
        if not rs:
            return "not run"
        good = ok(rs, phase)
        if good:
            procs = {r.get("procs", r.get("participant_processes", 1)) for r in good}
            note = f" ({max(procs)} processes)" if max(procs) > 1 else ""
            return f(med(good, phase, "s"), 2, " s") + note
        r = rs[0]
        err = r.get(phase, {}).get("error") or r.get(phase, {}).get("errors") or r.get("error")
        if phase == "reform" and not r.get("reform") and not r.get("form", {}).get("ok"):
            return "not reached"
        if isinstance(err, list):
            err = err[0]
        if str(err).endswith(": "):
            err = f"{str(err)[:-2]} (at the join timeout, {r.get('harness_timeout', '150')} s)"
        return f"**failed**: {str(err)[:90]}"

    sizes = sorted(set(list(reg) + [n for n, _ in tor]))
    lines = ["| agents (ranks for Regroup) | form: Regroup | form: torch c10d | re-form after one dies: Regroup | "
             "re-form: torch c10d (last_call 1 s) | re-form ratio Regroup/torch | manager CPU forming / steady | manager RSS | torch store CPU (re-form) | torch participants' CPU (re-form) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for n in sizes:
        rs = ok(reg.get(n, []), "form")
        ts = tor.get((n, 1), [])
        # torch's best: its participants spread over several processes where that was run and
        # completed (one Python process caps them at one core), else one process.
        sp = [r for (m, _), v in spread.items() if m == n for r in v if r.get("reform", {}).get("ok")]
        if sp:
            ts = sp
        rf_reg = med(ok(reg.get(n, []), "reform"), "reform", "s")
        rf_tor = med(ok(ts, "reform"), "reform", "s") if ts else None
        lines.append(
            f"| {n} ({n * 8:,}) | {f(med(rs, 'form', 's'), 3, ' s') if rs else ('not run' if n not in reg else 'failed')} | "
            f"{torch_cell(ts, 'form') if n <= 256 else 'not run'} | {f(rf_reg, 3, ' s')} | "
            f"{torch_cell(ts, 'reform') if n <= 256 else 'not run'} | {ratio(rf_reg, rf_tor)} | "
            f"{f(med(rs, 'form', 'manager_cpu_pct'), 1, '%')} / {f(med(rs, 'steady', 'manager_cpu_pct'), 1, '%')} | "
            f"{f(med(rs, 'manager_hwm_mb'), 1, ' MB')} | "
            f"{f(med(ok(ts, 'reform'), 'reform', 'store_cpu_s'), 2, ' s') if ok(ts, 'reform') else 'n/a'} | "
            f"{f(med(ts, 'reform', 'clients_cpu_s') if ok(ts, 'reform') else med(ts, 'form', 'clients_cpu_s'), 1, ' s') if ts else 'n/a'} |")
    extra = []
    for (n, lc), rs in sorted(tor.items()):
        if lc != 1:
            extra.append(f"- torch c10d with its default `last_call_timeout` of {lc} s, {n} agents: form "
                         f"{torch_cell(rs, 'form')}, re-form {torch_cell(rs, 'reform')}.")
    for (n, lc), rs in sorted(tor.items()):
        if lc == 1 and any(m == n for m, _ in spread):
            extra.append(f"- torch c10d, {n} participants as threads of one process (one GIL, at most one core): "
                         f"form {torch_cell(rs, 'form')}, re-form {torch_cell(rs, 'reform')}.")
    for (n, procs), rs in sorted(spread.items()):
        extra.append(f"- torch c10d, {n} participants spread over {procs} processes: form "
                     f"{torch_cell(rs, 'form')}, re-form {torch_cell(rs, 'reform')}; participants' CPU "
                     f"{f(med(rs, 'form', 'clients_cpu_s'), 1, ' s')} forming, "
                     f"{f(med(rs, 'reform', 'clients_cpu_s'), 1, ' s')} re-forming.")
    nreg = sum(len(v) for v in reg.values())
    text = "\n".join(lines) + "\n\n" + "\n".join(extra) + (
        f"\n\nRegroup: median of {max((len(v) for v in reg.values()), default=0)} runs per size ({nreg} runs); "
        f"torch: {max((len(v) for v in tor.values()), default=0)} run per size. Loads (1-minute load average "
        f"before each run): Regroup {', '.join(sorted({r.get('loadavg_before', '?').split()[0] for r in rows if r.get('system') == 'regroup'}))}; "
        f"torch {', '.join(sorted({r.get('loadavg_before', '?').split()[0] for r in rows if r.get('system') == 'torch-c10d'}))}.\n")

    # plot: formation and re-formation times
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, phase, title in [(axes[0], "form", "N agents form a group"),
                             (axes[1], "reform", "one agent dies: the survivors' next group")]:
        xs = sorted(reg)
        ys = [med(ok(reg[n], phase), phase, "s") for n in xs]
        ax.plot([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], "o-", label="Regroup manager")
        tx = sorted(n for n, lc in tor if lc == 1)
        ty = [med(ok(tor[(n, 1)], phase), phase, "s") for n in tx]
        ax.plot([x for x, y in zip(tx, ty) if y is not None], [y for y in ty if y is not None], "s-",
                label="torch c10d, participants in 1 process (last_call 1 s)")
        sx = sorted({n for n, _ in spread})
        sy = [med(ok([r for (m, _), v in spread.items() if m == n for r in v], phase), phase, "s") for n in sx]
        if sx:
            ax.plot([x for x, y in zip(sx, sy) if y is not None], [y for y in sy if y is not None], "d--",
                    label="torch c10d, participants over 4 processes")
        for n in tx:
            if not ok(tor[(n, 1)], phase):
                ax.axvline(n, color="red", ls=":", lw=1)
                ax.annotate(f"torch, 1 process:\nfailed at {n}", (n, ax.get_ylim()[1] if ax.get_ylim()[1] > 1 else 1),
                            color="red", fontsize=8, ha="right", va="top")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("agents (nodes)")
        ax.set_ylabel("seconds until every agent has its group")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(outdir / "scale_times.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = sorted(reg)
    ax.plot(xs, [med(reg[n], "steady", "manager_cpu_pct") for n in xs], "o-", label="manager CPU, steady (% of a core)")
    ax.plot(xs, [med(reg[n], "form", "manager_cpu_pct") for n in xs], "^-", label="manager CPU while forming (%)")
    ax2 = ax.twinx()
    ax2.plot(xs, [med(reg[n], "manager_hwm_mb") for n in xs], "s--", color="gray", label="manager peak RSS (MB)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("agents (x 8 ranks)")
    ax.set_ylabel("CPU %")
    ax2.set_ylabel("MB")
    ax.set_title("regroup-manager cost (heartbeats every 1 s)")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(outdir / "scale_manager.png", dpi=110)
    plt.close(fig)
    return text


# ------------------------------------------------------------------------------------------------
# Part B
# ------------------------------------------------------------------------------------------------


def plot_timeline(ax, run: dict, color: str, label: str) -> None:
    """One run's committed steps against time, its faults dotted."""
    tl = run.get("timeline", [])
    if tl:
        ax.plot([t for t, _, _ in tl], [st for _, st, _ in tl], ".", ms=3, color=color, label=label)
    for x in run.get("faults", []):
        if "at_s" in x:
            ax.axvline(x["at_s"], color=color, ls=":", lw=1)
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("committed step")


def recovery_section(rows, outdir: Path) -> str:
    runs = [r for r in rows if not r.get("baseline")]
    base = [r for r in rows if r.get("baseline")]
    systems = [s for s in LABEL if any(r["system"] == s for r in rows)]
    good = {s: [r for r in runs if r["system"] == s and r.get("ok")] for s in systems}
    bad = {s: [r for r in runs if r["system"] == s and not r.get("ok")] for s in systems}

    def fm(s, fault, key):
        vals = []
        for r in good[s]:
            for x in r.get("faults", []):
                if x["fault"] == fault and isinstance(x.get(key), (int, float)):
                    vals.append(float(x[key]))
        return median(vals), len(vals)

    out = []
    out.append("| fault | measure | " + " | ".join(LABEL[s] for s in systems) + " | " +
               " | ".join(f"Regroup / {LABEL[s].split(',')[0]}{',' + LABEL[s].split(',')[1] if ',' in LABEL[s] else ''}"
                          for s in systems if s != "regroup") + " |")
    out.append("|---|---|" + "---|" * len(systems) + "---|" * (len(systems) - 1))
    measures = [("detect_s", "time to detect (s)"), ("resume_s", "fault -> first committed step (s)"),
                ("pause_s", "longest time without a committed step (s)"), ("redone", "steps lost and redone")]
    for fault, fname in FAULTS:
        for key, mname in measures:
            vals = {s: fm(s, fault, key) for s in systems}
            cells = [f(vals[s][0], 2 if key != "redone" else 0) if vals[s][1] else "n/a" for s in systems]
            ratios = [ratio(vals["regroup"][0], vals[s][0]) if key != "redone" and "regroup" in vals else "-"
                      for s in systems if s != "regroup"]
            out.append(f"| {fname} | {mname} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    # job time
    jobs = {s: median([r["job_s"] for r in good[s] if "job_s" in r]) for s in systems}
    cells = [f(jobs[s], 1) for s in systems]
    ratios = [ratio(jobs.get("regroup"), jobs[s]) for s in systems if s != "regroup"]
    steps = next((r["steps"] for r in runs), "?")
    out.append(f"| all three, in one run | total job time for {steps} steps (s) | " + " | ".join(cells) + " | " +
               " | ".join(ratios) + " |")
    if base:
        bj = {s: median([r["job_s"] for r in base if r["system"] == s and r.get("ok") and "job_s" in r]) for s in systems}
        out.append(f"| none (baseline, 1 run) | job time for {steps} steps (s) | " + " | ".join(f(bj[s], 1) for s in systems)
                   + " | " + " | ".join(ratio(bj.get("regroup"), bj[s]) for s in systems if s != "regroup") + " |")
    text = "\n".join(out) + "\n\n"
    text += "Runs: " + "; ".join(f"{LABEL[s]}: {len(good[s])} complete" + (f", {len(bad[s])} failed ({'; '.join(r.get('error', '?')[:120] for r in bad[s])})" if bad[s] else "")
                                 for s in systems) + ".\n"
    loads = [r.get("loadavg_before", "?").split()[0] for r in rows]
    text += f"1-minute load average before each run: {', '.join(loads)}.\n"

    # Bar chart: resume time per fault
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    for ax, (fault, fname) in zip(axes, FAULTS):
        meds = [fm(s, fault, "resume_s")[0] or 0 for s in systems]
        pts = [[x.get("resume_s") for r in good[s] for x in r.get("faults", []) if x["fault"] == fault] for s in systems]
        ax.bar(range(len(systems)), meds, color=["tab:green", "tab:orange", "tab:red"][:len(systems)])
        for i, p in enumerate(pts):
            ax.plot([i] * len([v for v in p if v is not None]), [v for v in p if v is not None], "k.", ms=5)
            ax.text(i, meds[i], f"{meds[i]:.1f}", ha="center", va="bottom", fontsize=9)
        ax.set_xticks(range(len(systems)))
        ax.set_xticklabels([SHORT[s] for s in systems], fontsize=8)
        ax.set_title(fname, fontsize=9)
        ax.set_ylabel("fault -> first committed step (s)")
    fig.suptitle("Recovery: median (bar) and each run (dots), 2 nodes x 2 ranks on loopback")
    fig.tight_layout()
    fig.savefig(outdir / "recovery_resume.png", dpi=110)
    plt.close(fig)

    # Timeline: committed step vs time, first complete run of each system
    fig, ax = plt.subplots(figsize=(11, 4.5))
    colors = {"regroup": "tab:green", "torchrun-ckpt10": "tab:orange", "torchrun-ckpt1": "tab:red"}
    # One repetition in which every system completed (the same machine conditions), if any.
    reps = sorted({r.get("rep") for r in runs})
    both = [rep for rep in reps if all(any(r.get("rep") == rep for r in good[s]) for s in systems)]
    for s in systems:
        if not good[s]:
            continue
        r = next((r for r in good[s] if both and r.get("rep") == both[0]), good[s][0])
        plot_timeline(ax, r, colors[s], LABEL[s])
    ax.set_title("Committed steps over time, one run each" + (f" (repetition {both[0]})" if both else "")
                 + "; dotted: trainer killed, node killed, node back")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(outdir / "recovery_timeline.png", dpi=110)
    plt.close(fig)
    return text


# ------------------------------------------------------------------------------------------------
# Part C: the peers
# ------------------------------------------------------------------------------------------------

PEERS = {"regroup": "Regroup", "torchrun-ckpt10": "torchrun, ckpt every 10 steps", "torchft": "torchft 0.2.0",
         "nvrx": "nvidia-resiliency-ext 0.4.1, in-process restart"}
SCRIPTS = {"regroup": "train_bench.py", "torchrun-ckpt10": "train_bench.py", "torchft": "train_torchft.py",
           "nvrx": "train_nvrx.py"}


def script_cost(system: str, here: Path = HERE) -> str:
    """Lines changed from train_plain.py (code lines; comments, blank lines, docstring left out)."""
    name = SCRIPTS.get(system)
    if not name or not (here / name).exists():
        return "n/a"
    d = changed_lines((here / "train_plain.py").read_text(), (here / name).read_text())
    note = " (the same script as Regroup's)" if system.startswith("torchrun") else ""
    return f"+{d['added']} / -{d['removed']}{note}"


def peers_table(rows, here: Path = HERE) -> str:
    """The peers' table: medians per system over the complete runs with faults (and, for the
    steady step and fault-free job time, the fault-free runs); cells a peer cannot fill say why."""
    systems = [s for s in PEERS if any(r.get("system") == s for r in rows)]
    faulty = {s: [r for r in rows if r.get("system") == s and not r.get("baseline") and r.get("ok")] for s in systems}
    clean = {s: [r for r in rows if r.get("system") == s and r.get("baseline") and r.get("ok")] for s in systems}
    failed = {s: [r for r in rows if r.get("system") == s and not r.get("ok")] for s in systems}
    notes: list = []

    def failed_why(s):
        if not faulty[s] and failed[s]:
            return (f"{PEERS[s]}: every run with faults failed ({len(failed[s])}): "
                    f"{str(failed[s][0].get('error', '?'))[:120]}")
        return None

    def fault_vals(s, fault, key):
        vals, why, left = [], None, []
        for r in faulty[s]:
            for x in r.get("faults", []):
                if x.get("fault") != fault:
                    continue
                if x.get("unsupported"):
                    why = x["unsupported"]
                elif isinstance(x.get(key), (int, float)):
                    vals.append(float(x[key]))
                elif key != "redone" and isinstance(r.get("job_s"), (int, float)) and "at_s" in x:
                    left.append(r["job_s"] - x["at_s"])  # the job ended first
        if not vals and not why:
            why = failed_why(s)
        if not vals and not why and left:
            why = (f"{PEERS[s]}: the job ended {f(min(left), 0)} to {f(max(left), 0)} s after the fault, before "
                   "the node was back at full size (its step is short, the returning processes' start long)")
        return vals, why

    def cell(vals, why, digits=2):
        if why:
            if why not in notes:
                notes.append(why)
            kind = "not back by the end" if "job ended" in why else "failed" if "failed" in why else "not supported"
            return f"{kind} ({notes.index(why) + 1})"
        return f(median(vals), digits) if vals else "n/a"

    peers = [s for s in systems if s != "regroup"]
    head = "| fault | measure | " + " | ".join(PEERS[s] for s in systems) + " | " + \
        " | ".join(f"Regroup / {PEERS[s].split(',')[0]}" for s in peers) + " |"
    out = [head, "|---|---|" + "---|" * (len(systems) + len(peers))]

    def row(fault_name, measure, per, ratios=True, digits=2):
        cells = [cell(*per[s], digits=digits) for s in systems]
        rs = []
        for s in peers:
            a, b = median(per.get("regroup", ([], None))[0]), median(per[s][0])
            rs.append(ratio(a, b) if ratios and not per[s][1] else "-")
        out.append(f"| {fault_name} | {measure} | " + " | ".join(cells) + " | " + " | ".join(rs) + " |")

    for fault, fname in FAULTS:
        row(fname, "fault -> next committed step (s)", {s: fault_vals(s, fault, "resume_s") for s in systems})
        row(fname, "longest stop (s)", {s: fault_vals(s, fault, "pause_s") for s in systems})
        row(fname, "steps redone", {s: fault_vals(s, fault, "redone") for s in systems}, ratios=False, digits=0)

    def run_vals(rs, key, sub=None, s=None):
        v = [r.get(key) if sub is None else (r.get(key) or {}).get(sub) for r in rs]
        v = [float(x) for x in v if isinstance(x, (int, float))]
        return v, (failed_why(s) if s and not v else None)

    lost = {s: run_vals(faulty[s], "samples_lost", s=s) for s in systems}
    rep = {s: run_vals(faulty[s], "samples_repeated", s=s) for s in systems}
    out.append("| all three, one run | samples lost / repeated vs the fault-free run | " + " | ".join(
        f"{cell(*lost[s], digits=0)} / {cell(*rep[s], digits=0)}" for s in systems) + " | " + " | ".join("-" for _ in peers) + " |")
    w = {s: run_vals(faulty[s], "weights_vs_fault_free", "rel_l2") for s in systems}
    wm = {s: run_vals(faulty[s], "weights_vs_fault_free", "max_abs") for s in systems}
    out.append("| all three, one run | final weights vs the fault-free run: relative L2 / max abs | " + " | ".join(
        (f"{median(w[s][0]):.1e} / {median(wm[s][0]):.1e}" if w[s][0] else "n/a") for s in systems) + " | " +
        " | ".join("-" for _ in peers) + " |")
    row("all three, one run", "job time (s)", {s: run_vals(faulty[s], "job_s", s=s) for s in systems})
    row("none", "steady-state step (s, median between commits after step 5)",
        {s: run_vals(clean[s], "steady_step_s") for s in systems}, digits=3)
    row("none", "job time (s)", {s: run_vals(clean[s], "job_s") for s in systems})
    out.append("| - | training script: lines changed from a plain DDP script (+ added / - removed) | " +
               " | ".join(script_cost(s, here) for s in systems) + " | " + " | ".join("-" for _ in peers) + " |")
    text = "\n".join(out) + "\n\n"
    for i, n in enumerate(notes):
        text += f"({i + 1}) {n}.\n"
    steps = next((r.get("steps") for r in rows), "?")
    text += ("\nRuns of " + f"{steps} steps" + ": " + "; ".join(
        f"{PEERS[s]}: {len(faulty[s])} with faults, {len(clean[s])} without"
        + (f", {len(failed[s])} failed ({'; '.join(str(r.get('error', '?'))[:100] for r in failed[s])})" if failed[s] else "")
        for s in systems) + ".\n")
    loads = [str(r.get("loadavg_before", "?")).split()[0] for r in rows]
    text += f"1-minute load average before each run: {', '.join(loads)}.\n"
    return text


def peers_plot(rows, outdir: Path) -> None:
    systems = [s for s in PEERS if any(r.get("system") == s for r in rows)]
    colors = {"regroup": "tab:green", "torchrun-ckpt10": "tab:orange", "torchft": "tab:blue", "nvrx": "tab:purple"}
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [1, 1.6]})
    ax = axes[0]
    width = 0.8 / max(1, len(systems))
    for i, s in enumerate(systems):
        meds = []
        for fault, _ in FAULTS:
            v = [x.get("resume_s") for r in rows if r.get("system") == s and r.get("ok") and not r.get("baseline")
                 for x in r.get("faults", []) if x.get("fault") == fault and not x.get("unsupported")]
            meds.append(median([float(t) for t in v if isinstance(t, (int, float))]))
        xs = [k + i * width for k in range(len(FAULTS))]
        ax.bar([x for x, m in zip(xs, meds) if m is not None], [m for m in meds if m is not None], width,
               color=colors[s])
        for x, m in zip(xs, meds):
            if m is None:  # no figure: the table says why
                ax.text(x, 0.03, "no figure", ha="center", va="bottom", fontsize=6, rotation=90,
                        color=colors[s], transform=ax.get_xaxis_transform())
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(FAULTS))])
    ax.set_xticklabels(["trainer killed", "node lost", "node back (full size)"], fontsize=8)
    ax.set_ylabel("fault -> next committed step (s), median")
    ax.set_yscale("log")
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=colors[s], label=PEERS[s]) for s in systems], fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    ax = axes[1]
    for s in systems:
        r = next((r for r in rows if r.get("system") == s and r.get("ok") and not r.get("baseline")), None)
        if not r:
            continue
        plot_timeline(ax, r, colors[s], PEERS[s])
    ax.set_title("one run each; dotted: trainer killed, node killed, node back", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(outdir / "peers.png", dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--results", default=str(HERE / "results"))
    p.add_argument("--no-readme", action="store_true")
    args = p.parse_args()
    res = Path(args.results).resolve()
    rel = res.relative_to(HERE) if res.is_relative_to(HERE) else res
    m = machine()
    parts = [f"Tables made {m['date']} (each part's runs are dated in the text above) on {m['cores']} cores ({m['cpu']}), {m['memory']}, Linux {m['kernel']}, "
             f"Python {m['python']}, torch {m['torch']}; load average when the report was made: {m['loadavg']}.\n"]
    scale = read_jsonl(res / "scale.jsonl")
    if scale:
        parts.append("### Control plane at scale\n\n" + scale_section(scale, res) +
                     f"\n![formation times]({rel}/scale_times.png)\n"
                     f"![manager cost]({rel}/scale_manager.png)\n")
    rec = read_jsonl(res / "recovery.jsonl")
    if rec:
        parts.append("### Recovery end to end\n\n" + recovery_section(rec, res) +
                     f"\n![resume times]({rel}/recovery_resume.png)\n"
                     f"![timeline]({rel}/recovery_timeline.png)\n")
    peers = read_jsonl(res / "peers.jsonl")
    if peers:
        peers_plot(peers, res)
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(min(r.get("invocation", 0) for r in peers)))
        parts.append("### Side by side with torchft and nvidia-resiliency-ext\n\n"
                     f"Trainers on the pinned torch 2.15.0 venv; invocation started {when}.\n\n" + peers_table(peers) +
                     f"\n![peers]({rel}/peers.png)\n")
    text = "\n".join(parts)
    (res / "tables.md").write_text(text)
    print(text)
    if not args.no_readme:
        readme = HERE / "README.md"
        body = readme.read_text() if readme.exists() else "<!-- results:begin -->\n<!-- results:end -->\n"
        a, b = "<!-- results:begin -->", "<!-- results:end -->"
        if a in body and b in body:
            head, rest = body.split(a, 1)
            _, tail = rest.split(b, 1)
            readme.write_text(head + a + "\n" + text + "\n" + b + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
