#!/usr/bin/python3
"""docs/results.md and its figures from a `harrier-bench convergence` grid.

  convergence_report.py --grid_dir=DIR --docs_dir=D [--advice=FILE ...]
      [--survey_rates=FILE] [--gnuplot=PATH] [--no_figures]

Reads DIR/runs.jsonl (or DIR/runs.csv when there is no runs.jsonl) and
DIR/curves.csv (harrier-bench convergence's files), and each --advice FILE
(the `harrier-advise --json` line). Writes D/results.md and, per
(model, link), D/results/*.png + *.svg with the gnuplot script that made
each (*.gp, data inline: `cd D/results && gnuplot NAME.gp` redraws it),
and D/results/advisor_check.jsonl (one line per advice: the pick's rank by
measured time to target). Also reads, when present, DIR/grid_args.txt and
DIR/machine.txt (written by results.sh) for the budget section.

Time and steps to target are recomputed from curves.csv (rank 0's first
eval at or above the target); a run without curve rows keeps the figure of
runs.jsonl, and a disagreement between the two is listed in the report.
Exit status: 0, or 2 with one line on stderr for a bad input.
"""

import argparse
import csv
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

RUN_KEYS = [
    "bench", "run_id", "model", "sync", "codec", "codec_spec", "pull_codec",
    "link_gbps", "link_measured_gbps", "workers", "shards", "batch_size",
    "target_accuracy", "time_to_target_s", "steps_to_target", "final_accuracy",
    "best_accuracy", "final_loss", "steps", "wall_s", "step_s",
    "bytes_up_per_step", "bytes_down_per_step", "status", "error",
]
# Written by newer grids (CPU per step); older files lack them: -1.
OPTIONAL_KEYS = ["worker_cpu_ms_per_step", "shard_cpu_ms_per_step"]
RUNS_CSV_HEADERS = [RUN_KEYS, RUN_KEYS[:-2] + OPTIONAL_KEYS + RUN_KEYS[-2:]]
STRING_KEYS = {"bench", "run_id", "model", "sync", "codec", "codec_spec",
               "pull_codec", "status", "error"}
CURVE_KEYS = ["run_id", "model", "sync", "codec", "pulls", "link_gbps", "step",
              "wall_s", "loss", "accuracy", "bytes_up", "bytes_down"]
# The grid's order (harrier-bench convergence), so tables and legends read the same way.
SYNC_ORDER = ["bsp", "ssp2", "asp", "local4"]
CODEC_ORDER = ["none", "fp16", "topk", "randomk", "dgc", "qsgd4", "qsgd8",
               "terngrad", "signsgd", "efsign", "signum", "onebit", "powersgd2"]
# More lines than this in one figure are unreadable: split per sync, then
# per pulls (the full grid has 26 runs per sync and link).
MAX_LINES = 14
MAX_BARS = 26
# gnuplot's dash types 1-4 and a fixed colour per codec: a codec keeps its
# colour across figures, a sync its dash pattern.
CODEC_COLORS = ["#000000", "#e41a1c", "#377eb8", "#4daf4a", "#984ea3",
                "#ff7f00", "#a65628", "#f781bf", "#999999", "#66c2a5",
                "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e"]
RUN_ID_RE = re.compile(r"^[a-z0-9]+-[a-z0-9]+-[a-z0-9]+-pull(on|off|paired)-[0-9.]+g$")
TOLERANCE = 0.01  # relative; runs.jsonl and curves.csv print rounded figures


class InputError(Exception):
    """A bad input file: reported as one line, exit status 2."""


def order_key(value, order):
    return (order.index(value), value) if value in order else (len(order), value)


def run_sort_key(run):
    return (run["model"], run["link_gbps"], order_key(run["sync"], SYNC_ORDER),
            order_key(run["codec"], CODEC_ORDER), run["pulls"])


def fmt_link(gbps):
    """The grid's %g spelling of a link rate (run ids, file names)."""
    return "%g" % gbps


def pulls_of(run_id):
    m = re.search(r"-pull(on|off|paired)-", run_id)
    return m.group(1) if m else "off"


def to_number(text, where):
    try:
        return float(text)
    except (TypeError, ValueError):
        raise InputError(f"{where}: not a number: {text!r}")


def normalise_run(raw, where):
    missing = [k for k in RUN_KEYS if k not in raw]
    if missing:
        raise InputError(f"{where}: missing keys {','.join(missing)}")
    run = {}
    for key in RUN_KEYS:
        value = raw[key]
        run[key] = str(value) if key in STRING_KEYS else to_number(value, f"{where} {key}")
    for key in OPTIONAL_KEYS:
        run[key] = to_number(raw[key], f"{where} {key}") if key in raw else -1.0
    if run["status"] not in ("ok", "failed"):
        raise InputError(f"{where}: status must be ok or failed, not {run['status']!r}")
    if not RUN_ID_RE.match(run["run_id"]):
        raise InputError(f"{where}: run_id {run['run_id']!r} is not <model>-<sync>-<codec>-pull<on|off|paired>-<link>g")
    run["pulls"] = pulls_of(run["run_id"])
    return run


def load_runs(grid_dir):
    """Runs by run_id; a later line replaces an earlier one, but a failed
    line never replaces an ok one (a resumed grid reruns failed runs only)."""
    jsonl = os.path.join(grid_dir, "runs.jsonl")
    csv_path = os.path.join(grid_dir, "runs.csv")
    rows = []
    if os.path.exists(jsonl):
        with open(jsonl) as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    raw = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{jsonl}:{number}: not JSON ({e.msg})")
                if not isinstance(raw, dict):
                    raise InputError(f"{jsonl}:{number}: not a JSON object")
                if raw.get("bench") != "convergence":
                    continue
                rows.append(normalise_run(raw, f"{jsonl}:{number}"))
    elif os.path.exists(csv_path):
        with open(csv_path, newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames not in RUNS_CSV_HEADERS:
                raise InputError(f"{csv_path}: header is not the columns runs.csv has")
            for number, raw in enumerate(reader, 2):
                rows.append(normalise_run(raw, f"{csv_path}:{number}"))
    else:
        raise InputError(f"{grid_dir}: no runs.jsonl or runs.csv (run the grid first)")
    runs = {}
    for run in rows:
        old = runs.get(run["run_id"])
        if old is not None and old["status"] == "ok" and run["status"] != "ok":
            continue
        runs[run["run_id"]] = run
    if not runs:
        raise InputError(f"{grid_dir}: the grid has no runs")
    return runs


def load_curves(grid_dir):
    path = os.path.join(grid_dir, "curves.csv")
    curves = {}
    if not os.path.exists(path):
        return curves
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != CURVE_KEYS:
            raise InputError(f"{path}: header is not {','.join(CURVE_KEYS)}")
        for number, raw in enumerate(reader, 2):
            where = f"{path}:{number}"
            point = {k: to_number(raw[k], f"{where} {k}")
                     for k in ("step", "wall_s", "loss", "accuracy", "bytes_up", "bytes_down")}
            curves.setdefault(raw["run_id"], []).append(point)
    for points in curves.values():
        points.sort(key=lambda p: p["step"])
    return curves


def first_at_target(points, target):
    """(wall_s, step) of the first eval at or above target, or (-1, -1)."""
    for p in points:
        if p["accuracy"] >= target:
            return p["wall_s"], p["step"]
    return -1.0, -1.0


def close(a, b):
    if a < 0 or b < 0:
        return (a < 0) == (b < 0)
    return abs(a - b) <= TOLERANCE * max(abs(a), abs(b), 1e-9) + 1e-6


def derive(runs, curves):
    """Adds ttt, stt (time and steps to target), reached, the rank by
    ttt among the runs of its (model, link) and notes of disagreements."""
    notes = []
    for run in runs.values():
        points = curves.get(run["run_id"], [])
        run["points"] = points if run["status"] == "ok" else []
        run["ttt"], run["stt"] = run["time_to_target_s"], run["steps_to_target"]
        if run["status"] == "ok" and points:
            ttt, stt = first_at_target(points, run["target_accuracy"])
            if not close(ttt, run["time_to_target_s"]) or not close(stt, run["steps_to_target"]):
                notes.append(f"`{run['run_id']}`: runs.jsonl says {run['time_to_target_s']:g} s / "
                             f"{run['steps_to_target']:g} steps to target, curves.csv {ttt:g} s / {stt:g} steps "
                             "(the report uses curves.csv)")
            run["ttt"], run["stt"] = ttt, stt
        run["reached"] = run["status"] == "ok" and run["ttt"] >= 0
        run["rank"] = None
    for group in groups(runs).values():
        reached = sorted((r for r in group if r["reached"]), key=lambda r: (r["ttt"], r["run_id"]))
        for rank, run in enumerate(reached, 1):
            run["rank"] = rank
    return notes


def groups(runs):
    """(model, link) -> runs, in the grid's order."""
    out = {}
    for run in sorted(runs.values(), key=run_sort_key):
        out.setdefault((run["model"], run["link_gbps"]), []).append(run)
    return out


def split_for_figure(runs, limit):
    """[(suffix, runs)]: all runs in one figure, or one per sync, or one per
    sync and pulls, whichever first keeps every figure within limit."""
    if len(runs) <= limit:
        return [("", runs)]
    by_sync = {}
    for run in runs:
        by_sync.setdefault(run["sync"], []).append(run)
    out = []
    for sync in sorted(by_sync, key=lambda s: order_key(s, SYNC_ORDER)):
        part = by_sync[sync]
        if len(part) <= limit:
            out.append((f"-{sync}", part))
            continue
        for pulls in ("off", "on", "paired"):
            sub = [r for r in part if r["pulls"] == pulls]
            if sub:
                out.append((f"-{sync}-pull{pulls}", sub))
    return out


def label(run):
    return f"{run['sync']} {run['codec']} pull{run['pulls']}"


def style(run):
    color = CODEC_COLORS[order_key(run["codec"], CODEC_ORDER)[0] % len(CODEC_COLORS)]
    dash = order_key(run["sync"], SYNC_ORDER)[0] % 4 + 1
    points = "linespoints pt 6 ps 0.6" if run["pulls"] != "off" else "lines"
    return f"with {points} lw 1.5 dt {dash} lc rgb '{color}'"


def terminals(gnuplot):
    """(png terminal, whether svg exists), asked of gnuplot itself."""
    try:
        out = subprocess.run([gnuplot, "-e", "set terminal"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InputError(f"cannot run gnuplot ({gnuplot}): {e}")
    names = set(re.findall(r"^\s*(\S+)\s", out.stdout + out.stderr, re.M))
    png = "pngcairo" if "pngcairo" in names else ("png" if "png" in names else None)
    if png is None or "svg" not in names:
        raise InputError(f"gnuplot ({gnuplot}) has no png/pngcairo or no svg terminal")
    return png


def gp_quote(text):
    return "'" + text.replace("'", "''") + "'"


def write_figure(out_dir, name, png_term, preamble, series, plot_spec):
    """One .gp with inline data blocks; the caller runs it. series: [(title,
    rows, style)]; plot_spec(block, title, style) -> a plot clause."""
    lines = [f"# generated by bench/scripts/convergence_report.py; redraw: gnuplot {name}.gp"]
    for i, (_, rows, _) in enumerate(series):
        lines.append(f"$d{i} << EOD")
        lines.extend(" ".join(str(v) for v in row) for row in rows)
        lines.append("EOD")
    lines.extend(preamble)
    clauses = [plot_spec(f"$d{i}", title, st) for i, (title, _, st) in enumerate(series)]
    plot = "plot " + ", \\\n     ".join(clauses)
    lines.append(f"set terminal {png_term} size 1100,700 noenhanced")
    lines.append(f"set output {gp_quote(name + '.png')}")
    lines.append(plot)
    lines.append("set terminal svg size 1100,700 noenhanced")
    lines.append(f"set output {gp_quote(name + '.svg')}")
    lines.append("replot")
    lines.append("unset output")
    with open(os.path.join(out_dir, name + ".gp"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return name


def figures_for(model, link, runs, out_dir, png_term):
    """Writes the .gp of every figure of one (model, link); returns
    [(kind, name, caption)]."""
    made = []
    tag = f"{model}-{fmt_link(link)}g"
    link_text = "unshaped" if link == 0 else f"{fmt_link(link)} Gbit/s"
    plotted = [r for r in runs if r["points"]]
    common = ["set key outside right top vertical", "set grid", "set tics nomirror"]
    target = runs[0]["target_accuracy"]
    for kind, x, y, xlabel, ylabel in (
            ("acc_steps", "step", "accuracy", "steps (rank 0)", "test accuracy"),
            ("acc_wall", "wall_s", "accuracy", "training wall time, s (evals excluded)", "test accuracy"),
            ("loss_steps", "step", "loss", "steps (rank 0)", "training loss (mean since last eval)")):
        for suffix, part in split_for_figure(plotted, MAX_LINES):
            name = f"{kind}-{tag}{suffix}"
            title = f"{model}, {link_text}{(' ' + suffix[1:]) if suffix else ''}: {ylabel} vs {xlabel.split(',')[0]}"
            preamble = common + [f"set title {gp_quote(title)}", f"set xlabel {gp_quote(xlabel)}",
                                 f"set ylabel {gp_quote(ylabel)}"]
            if y == "accuracy":
                preamble.append(f"set arrow from graph 0, first {target} to graph 1, first {target} "
                                "nohead dt 3 lc rgb '#888888'")
            series = [(label(r), [(p[x], p[y]) for p in r["points"] if p[y] >= 0], style(r)) for r in part]
            series = [s for s in series if s[1]]
            if not series:
                continue
            write_figure(out_dir, name, png_term, preamble, series,
                         lambda block, t, st: f"{block} using 1:2 title {gp_quote(t)} {st}")
            made.append((kind, name, title))
    measured = [r for r in runs if r["status"] == "ok" and r["bytes_up_per_step"] >= 0]
    for suffix, part in split_for_figure(measured, MAX_BARS):
        name = f"bytes-{tag}{suffix}"
        title = f"{model}, {link_text}{(' ' + suffix[1:]) if suffix else ''}: bytes per step (rank 0)"
        rows = [(i, max(r["bytes_up_per_step"], 1), max(r["bytes_down_per_step"], 1), '"' + label(r) + '"')
                for i, r in enumerate(part)]
        preamble = common + [
            f"set title {gp_quote(title)}", "set ylabel 'bytes per step (log)'", "set logscale y",
            "set style data histograms", "set style histogram clustered gap 1",
            "set style fill solid 0.8 border -1", "set boxwidth 0.9",
            "set xtics rotate by -45 left font ',9'", "set key inside top right",
            "set bmargin 10", "set rmargin 14"]
        # One data block, two columns: written as a single series.
        write_figure(out_dir, name, png_term, preamble, [("", rows, "")],
                     lambda block, t, st: (f"{block} using 2:xtic(4) title 'up (push)' lc rgb '#377eb8', "
                                           f"'' using 3 title 'down (pull)' lc rgb '#e41a1c'"))
        made.append(("bytes", name, title))
    return made


def run_gnuplot(gnuplot, out_dir, names):
    for name in names:
        try:
            done = subprocess.run([gnuplot, name + ".gp"], cwd=out_dir, capture_output=True,
                                  text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise InputError(f"gnuplot {name}.gp: no result in 120 s")
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise InputError(f"gnuplot {name}.gp failed: {first}")
        for ext in ("png", "svg"):
            path = os.path.join(out_dir, f"{name}.{ext}")
            if not os.path.exists(path) or os.path.getsize(path) == 0:
                raise InputError(f"gnuplot {name}.gp wrote no {ext}")


def load_advice(paths, runs):
    """[(advice, link)] from harrier-advise --json files. The link is the
    line's link_gbps if it has one, else the file name's -<link>g, else
    the grid link nearest to the measured upstream rate."""
    links = sorted({r["link_gbps"] for r in runs.values()})
    out = []
    for path in paths:
        if not os.path.exists(path):
            raise InputError(f"--advice {path}: no such file")
        found = None
        with open(path) as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    raw = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{path}:{number}: not JSON ({e.msg})")
                if isinstance(raw, dict) and raw.get("bench") == "advise":
                    found = raw
        if found is None:
            raise InputError(f"{path}: no {{\"bench\":\"advise\"}} line")
        pick = found.get("pick")
        if not isinstance(pick, dict) or not all(k in pick for k in ("sync", "codec", "pulls")):
            raise InputError(f"{path}: pick lacks sync, codec or pulls")
        if "link_gbps" in found:
            link = to_number(found["link_gbps"], f"{path} link_gbps")
        else:
            m = re.search(r"-([0-9.]+)g\.json[l]?$", os.path.basename(path))
            if m:
                link = float(m.group(1))
            elif links:
                up = to_number(found.get("link_gbps_measured_up", -1), f"{path} link_gbps_measured_up")
                link = min(links, key=lambda l: abs((l or 1e9) - up))
            else:
                raise InputError(f"{path}: cannot tell which link the advice is for")
        out.append((found, link, path))
    return out


def check_advice(advice, runs):
    """One dict per advice: the pick's run, its rank and ratio to the best."""
    checks = []
    for adv, link, path in advice:
        model = adv.get("model", "")
        pick = adv["pick"]
        run_id = f"{model}-{pick['sync']}-{pick['codec']}-pull{pick['pulls']}-{fmt_link(link)}g"
        group = [r for r in runs.values() if r["model"] == model and r["link_gbps"] == link]
        reached = sorted((r for r in group if r["reached"]), key=lambda r: r["ttt"])
        best = reached[0] if reached else None
        run = runs.get(run_id)
        check = {"bench": "advisor_check", "model": model, "link_gbps": link, "advice": os.path.basename(path),
                 "pick": run_id, "measured": bool(run), "pick_time_to_target_s": -1.0,
                 "predicted_time_to_target_s": float(pick.get("predicted_time_to_target_s", -1)),
                 "link_gbps_measured_up": float(adv.get("link_gbps_measured_up", -1)),
                 "link_gbps_measured_down": float(adv.get("link_gbps_measured_down", -1)),
                 "best": best["run_id"] if best else "", "best_time_to_target_s": best["ttt"] if best else -1.0,
                 "rank": -1, "of": len(reached), "ratio": -1.0, "within_10pct": False, "top3": False}
        # How well the step model did: measured over predicted step time,
        # per option the grid ran on this link (median and range).
        ratios = []
        for o in adv.get("options", []):
            r = runs.get(f"{model}-{o['sync']}-{o['codec']}-pull{o['pulls']}-{fmt_link(link)}g")
            if r and r["status"] == "ok" and r["step_s"] > 0 and float(o.get("predicted_step_s", 0)) > 0:
                ratios.append(r["step_s"] / float(o["predicted_step_s"]))
        ratios.sort()
        check["step_ratio_median"] = round(statistics.median(ratios), 3) if ratios else -1.0
        check["step_ratio_min"] = round(ratios[0], 3) if ratios else -1.0
        check["step_ratio_max"] = round(ratios[-1], 3) if ratios else -1.0
        check["step_ratio_options"] = len(ratios)
        if run and run["reached"] and best:
            check["pick_time_to_target_s"] = run["ttt"]
            check["rank"] = run["rank"]
            check["ratio"] = round(run["ttt"] / best["ttt"], 4) if best["ttt"] > 0 else 1.0
            check["within_10pct"] = run["ttt"] <= 1.10 * best["ttt"]
            check["top3"] = run["rank"] <= 3
        checks.append(check)
    checks.sort(key=lambda c: (c["model"], c["link_gbps"]))
    return checks


def num(value, digits=3, unit=""):
    if value is None or value < 0:
        return "-"
    return f"{value:.{digits}f}{unit}"


def human_bytes(value):
    if value < 0:
        return "-"
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def read_text(path):
    if os.path.exists(path):
        with open(path) as f:
            return f.read().strip()
    return ""


def machine_now():
    cpu = ""
    for line in read_text("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return f"{os.uname().nodename}: {os.cpu_count()} CPUs {cpu}".strip()


def measured_for(entry, runs, by_group):
    """What the grid measured for a rate's algorithms, per model: how many
    runs reached the target, and the median of their steps to target over
    the steps of the same model and link's baseline (for a sync: BSP with
    codec none; for a codec: codec none under the same sync, else BSP's)."""
    parts = []
    for model in sorted({r["model"] for r in runs.values()}):
        ratios, reached, failed, total = [], 0, 0, 0
        for (m, link), group in by_group.items():
            if m != model:
                continue
            index = {(r["sync"], r["codec"], r["pulls"]): r for r in group}
            bsp = index.get(("bsp", "none", "off"))
            for name in entry["names"]:
                if entry["kind"] == "sync":
                    pairs = [(index.get((name, "none", "off")), bsp)]
                else:
                    pairs = [(index.get((s, name, "off")), index.get((s, "none", "off")) or bsp) for s in SYNC_ORDER]
                for run, base in pairs:
                    if run is None:
                        continue
                    total += 1
                    failed += run["status"] != "ok"
                    if run["reached"]:
                        reached += 1
                        if base is not None and base["reached"] and base["stt"] > 0:
                            ratios.append(run["stt"] / base["stt"])
        if total == 0:
            continue
        text = f"{model}: reached {reached}/{total}" + (f" ({failed} failed)" if failed else "")
        if ratios:
            ratios.sort()
            half = len(ratios) // 2
            median = ratios[half] if len(ratios) % 2 else (ratios[half - 1] + ratios[half]) / 2
            text += f", steps to target x{median:.2f} of the baseline"
        parts.append(text)
    if parts:
        return "; ".join(parts)
    return "not in this grid" + (" (with codec none, pulls off)" if entry["kind"] == "sync" else " (pulls off)")


def headline(by_group, checks):
    """The headline table: per (model, link) the fastest run to the target,
    dense BSP's time and the advisor's pick."""
    md = ["## Headline", "",
          "| model | link | fastest to target | time (s) | BSP / none / pulls off (s) | speed-up | advisor's pick | its rank |",
          "|---|---|---|---|---|---|---|---|"]
    picks = {(c["model"], c["link_gbps"]): c for c in checks}
    for (model, link), group in by_group.items():
        ranked = sorted((r for r in group if r["reached"]), key=lambda r: r["ttt"])
        base = next((r for r in group if (r["sync"], r["codec"], r["pulls"]) == ("bsp", "none", "off")), None)
        best = ranked[0] if ranked else None
        base_t = base["ttt"] if base and base["reached"] else -1
        speedup = f"{base_t / best['ttt']:.2f}x" if best and base_t > 0 and best["ttt"] > 0 else "-"
        pick = picks.get((model, link))
        pick_text = f"`{pick['pick']}`" if pick else "-"
        pick_rank = (f"{pick['rank']} of {pick['of']}" if pick["rank"] > 0 else "-") if pick else "-"
        md.append(f"| {model} | {fmt_link(link)} | {('`' + best['run_id'] + '`') if best else 'none reached it'} "
                  f"| {num(best['ttt'], 2) if best else '-'} | {num(base_t, 2)} | {speedup} | {pick_text} | {pick_rank} |")
    md.append("")
    return md


def write_markdown(docs_dir, grid_dir, runs, by_group, figures, checks, notes, rates, budget_args, machine,
                   advise_machine=""):
    md = []
    md.append("# Convergence and time to accuracy: results")
    md.append("")
    md.append("<!-- generated by bench/scripts/results.sh; do not edit -->")
    md.append("_Generated by `bench/scripts/results.sh`; do not edit. "
              "Regenerate: `bazel build -c opt //bench:harrier-bench //bench/advise:harrier-advise "
              "//server:harrier-server //worker:harrier-worker && sudo bench/scripts/results.sh` "
              "(root for the emulated links; the grid resumes where it stopped)._")
    md.append("")
    fixture = os.path.exists(os.path.join(grid_dir, "FIXTURE"))
    if fixture:
        md.append("> **FIXTURE DATA.** These figures come from the hand-written test grid "
                  "`tests/bench/scripts/testdata/`, not from a measurement. " + read_text(os.path.join(grid_dir, "FIXTURE")))
        md.append("")
    all_runs = sorted(runs.values(), key=run_sort_key)
    stamp = max(os.path.getmtime(os.path.join(grid_dir, n)) for n in ("runs.jsonl", "runs.csv")
                if os.path.exists(os.path.join(grid_dir, n)))
    md.append("## Budget")
    md.append("")
    invocations = [line for line in budget_args.splitlines() if line.strip()]
    if len(invocations) > 1:
        md.append(f"- grid: {len(invocations)} invocations into one directory, in this order "
                  "(each skips the runs already ok there):")
        md.extend(f"  - `{line.strip()}`" for line in invocations)
    else:
        md.append(f"- grid: `{invocations[0].strip() if invocations else 'not recorded (no grid_args.txt)'}`")
    md.append(f"- runs: {len(all_runs)} ({sum(r['status'] == 'ok' for r in all_runs)} ok, "
              f"{sum(r['status'] == 'failed' for r in all_runs)} failed); models "
              + ", ".join(sorted({r['model'] for r in all_runs})))
    md.append("- workers x shards: " + ", ".join(sorted({f"{r['workers']:g} x {r['shards']:g}" for r in all_runs}))
              + "; batch " + ", ".join(sorted({f"{r['batch_size']:g}" for r in all_runs})) + " per worker")
    md.append("- steps per run (rank 0): " + ", ".join(
        f"{m} up to {max(r['steps'] for r in all_runs if r['model'] == m):g}" for m in sorted({r['model'] for r in all_runs})))
    md.append("- links (Gbit/s per host; 0 = unshaped): " + ", ".join(
        f"{fmt_link(l)} (measured " + ", ".join(sorted({f"{r['link_measured_gbps']:.2f}" for r in all_runs
                                                       if r['link_gbps'] == l and r['link_measured_gbps'] >= 0}) or ["-"]) + ")"
        for l in sorted({r['link_gbps'] for r in all_runs})))
    md.append("- targets: " + ", ".join(sorted({f"{r['model']} {r['target_accuracy']:g}" for r in all_runs})))
    md.append("- grid files dated " + datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    md.append("- machine: " + "; ".join(line.strip() for line in machine.splitlines() if line.strip()))
    md.append("")
    md.append("Time to target: rank 0's training wall time (evaluations excluded) to its first "
              "evaluation at or above the target; steps likewise. Bytes per step are rank 0's push "
              "(up) and pull (down) payload per step. Rank: by time to target among the runs of the "
              "same model and link that reached it.")
    md.append("")

    md.extend(headline(by_group, checks))
    for (model, link), group in by_group.items():
        link_text = "unshaped" if link == 0 else f"{fmt_link(link)} Gbit/s"
        md.append(f"## {model}, {link_text}")
        md.append("")
        md.append("| run | sync | codec | pulls | final acc | best acc | time to target (s) | steps to target | "
                  "step (ms) | up / step | down / step | rank |")
        md.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in group:
            if r["status"] != "ok":
                err = r["error"].replace("|", "/") or "no message"
                md.append(f"| `{r['run_id']}` | {r['sync']} | {r['codec']} | {r['pulls']} | failed: {err} "
                          "| - | - | - | - | - | - | - |")
                continue
            ttt = num(r["ttt"], 2) if r["reached"] else "not reached"
            stt = f"{r['stt']:g}" if r["reached"] else "-"
            md.append(f"| `{r['run_id']}` | {r['sync']} | {r['codec']} | {r['pulls']} | {num(r['final_accuracy'], 4)} "
                      f"| {num(r['best_accuracy'], 4)} | {ttt} | {stt} | {num(r['step_s'] * 1000 if r['step_s'] >= 0 else -1, 1)} "
                      f"| {human_bytes(r['bytes_up_per_step'])} | {human_bytes(r['bytes_down_per_step'])} "
                      f"| {r['rank'] if r['rank'] else '-'} |")
        md.append("")
        for kind, name, caption in figures.get((model, link), []):
            md.append(f"![{caption}](results/{name}.png) ([svg](results/{name}.svg), [gnuplot](results/{name}.gp))")
            md.append("")

    md.append("## Convergence rates from the survey beside the measurements")
    md.append("")
    md.append(f"Survey: {rates['survey']}. {rates['note']}")
    md.append("")
    md.append("| family | grid names | rate | setting | assumptions | source | checked | measured |")
    md.append("|---|---|---|---|---|---|---|---|")
    for entry in rates["rates"]:
        md.append(f"| {entry['family']} | {', '.join(entry['names'])} | {entry['rate']} | {entry['setting']} "
                  f"| {entry['assumptions']} | {entry['source']} | {entry['checked']} | {measured_for(entry, runs, by_group)} |")
    md.append("")

    md.append("## The advisor's pick per link")
    md.append("")
    if not checks:
        md.append("No advice given (`harrier-advise --json` lines are passed with `--advice`).")
    else:
        md.append("The advisor measured the link (up / down Gbit/s) to shards behind an emulated link of the "
                  "grid's rate, and took steps to target from this grid (`--calibration`). Ratio: the pick's "
                  "measured time to target over the best measured one's.")
        if advise_machine:
            md.append("")
            md.append("The advisor ran on: " + "; ".join(l.strip() for l in advise_machine.splitlines() if l.strip()) + ".")
        md.append("")
        md.append("| model | link | advisor measured up / down | pick | predicted (s) | measured (s) | rank | best measured | best (s) | ratio | within 10 % |")
        md.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for c in checks:
            rank = f"{c['rank']} of {c['of']}" if c["rank"] > 0 else ("not measured" if not c["measured"] else "did not reach target")
            md.append(f"| {c['model']} | {fmt_link(c['link_gbps'])} | {num(c['link_gbps_measured_up'], 2)} / "
                      f"{num(c['link_gbps_measured_down'], 2)} | `{c['pick']}` | {num(c['predicted_time_to_target_s'], 2)} "
                      f"| {num(c['pick_time_to_target_s'], 2)} | {rank} | `{c['best']}` | {num(c['best_time_to_target_s'], 2)} "
                      f"| {num(c['ratio'], 3)} | {'yes' if c['within_10pct'] else 'no'} |")
        md.append("")
        md.append(f"Within 10 % of the best measured time to target: {sum(c['within_10pct'] for c in checks)} of "
                  f"{len(checks)}; among the measured top 3: {sum(c['top3'] for c in checks)} of {len(checks)}.")
        md.append("")
        md.append("The step model against the grid: measured over predicted step time of every option the grid "
                  "ran on that link (1.00 = exact; the ranking needs the ratio alike across options, not 1).")
        md.append("")
        md.append("| model | link | options | median | min | max |")
        md.append("|---|---|---|---|---|---|")
        for c in checks:
            md.append(f"| {c['model']} | {fmt_link(c['link_gbps'])} | {c['step_ratio_options']} | "
                      f"{num(c['step_ratio_median'], 2)} | {num(c['step_ratio_min'], 2)} | {num(c['step_ratio_max'], 2)} |")
    md.append("")
    if notes:
        md.append("## Disagreements between runs.jsonl and curves.csv")
        md.append("")
        md.extend(f"- {n}" for n in notes)
        md.append("")
    with open(os.path.join(docs_dir, "results.md"), "w") as f:
        f.write("\n".join(md))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid_dir", required=True, help="the convergence grid's out_dir")
    parser.add_argument("--docs_dir", required=True, help="results.md and results/ go here")
    parser.add_argument("--advice", action="append", default=[], help="a harrier-advise --json output (repeatable)")
    parser.add_argument("--survey_rates", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "survey_rates.json"))
    parser.add_argument("--gnuplot", default=shutil.which("gnuplot") or "gnuplot")
    parser.add_argument("--no_figures", action="store_true", help="tables only (no gnuplot)")
    args = parser.parse_args(argv)
    try:
        runs = load_runs(args.grid_dir)
        curves = load_curves(args.grid_dir)
        notes = derive(runs, curves)
        try:
            with open(args.survey_rates) as f:
                rates = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise InputError(f"--survey_rates {args.survey_rates}: {e}")
        advice = load_advice(args.advice, runs)
        checks = check_advice(advice, runs)
        by_group = groups(runs)
        out_dir = os.path.join(args.docs_dir, "results")
        os.makedirs(out_dir, exist_ok=True)
        # Figures of an earlier grid must not linger beside the new ones.
        for name in os.listdir(out_dir):
            if re.match(r"^(acc_steps|acc_wall|loss_steps|bytes)-.*\.(png|svg|gp)$", name):
                os.remove(os.path.join(out_dir, name))
        figures = {}
        if not args.no_figures:
            png = terminals(args.gnuplot)
            for (model, link), group in by_group.items():
                figures[(model, link)] = figures_for(model, link, group, out_dir, png)
            run_gnuplot(args.gnuplot, out_dir, [n for made in figures.values() for _, n, _ in made])
        with open(os.path.join(out_dir, "figures.txt"), "w") as f:
            f.writelines(f"{n}\n" for made in figures.values() for _, n, _ in made)
        with open(os.path.join(out_dir, "advisor_check.jsonl"), "w") as f:
            f.writelines(json.dumps(c) + "\n" for c in checks)
        write_markdown(args.docs_dir, args.grid_dir, runs, by_group, figures, checks, notes, rates,
                       read_text(os.path.join(args.grid_dir, "grid_args.txt")),
                       read_text(os.path.join(args.grid_dir, "machine.txt")) or machine_now() + " (the report's host)",
                       read_text(os.path.join(args.grid_dir, "advise_machine.txt")))
    except InputError as e:
        print(f"convergence_report: {e}", file=sys.stderr)
        return 2
    print(f"convergence_report: {len(runs)} runs, {sum(len(v) for v in figures.values())} figures, "
          f"{len(checks)} advice checks -> {os.path.join(args.docs_dir, 'results.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
