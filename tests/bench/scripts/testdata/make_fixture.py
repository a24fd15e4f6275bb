#!/usr/bin/python3
"""Writes the hand-made fixture grid in grid/ (runs.jsonl, runs.csv,
curves.csv, advice-*.jsonl): made-up curves in the file formats of harrier-bench
convergence and harrier-advise, for testing convergence_report.py and results.sh
before the real grid exists. Not a measurement.

Rerun after changing it: /usr/bin/python3 make_fixture.py (from this folder).
"""
import csv
import json
import math
import os

KEYS = ["bench", "run_id", "model", "sync", "codec", "codec_spec", "pull_codec", "link_gbps",
        "link_measured_gbps", "workers", "shards", "batch_size", "target_accuracy", "time_to_target_s",
        "steps_to_target", "final_accuracy", "best_accuracy", "final_loss", "steps", "wall_s", "step_s",
        "bytes_up_per_step", "bytes_down_per_step", "status", "error"]
SPECS = {"none": "none", "topk": "topk:ratio=0.01", "qsgd8": "qsgd:levels=127,bucket=512",
         "signsgd": "sign:scale=0", "powersgd2": "powersgd:rank=2", "efsign": "efsign"}
DENSE = {"mlp": 1077288, "cnn": 861480}
UP = {"none": 1.0, "topk": 0.02, "qsgd8": 0.255, "signsgd": 0.032, "powersgd2": 0.01, "efsign": 0.032}
TARGET = {"mlp": 0.85, "cnn": 0.88}
COMPUTE_S = {"mlp": 0.004, "cnn": 0.020}
STEPS, EVERY = 300, 20
# (model, sync, codec, pulls, tau in steps, plateau accuracy, failed)
RUNS = [
    ("mlp", "bsp", "none", "off", 60, 0.89, False),
    ("mlp", "bsp", "topk", "off", 70, 0.885, False),
    ("mlp", "bsp", "topk", "on", 78, 0.88, False),
    ("mlp", "bsp", "powersgd2", "off", 66, 0.88, True),
    ("mlp", "ssp2", "signsgd", "off", 90, 0.80, False),
    ("mlp", "asp", "none", "off", 75, 0.885, False),
    ("mlp", "local4", "qsgd8", "off", 72, 0.885, False),
    ("cnn", "bsp", "none", "off", 60, 0.91, False),
    ("cnn", "bsp", "efsign", "off", 70, 0.905, False),
]
LINKS = {"mlp": [1, 10], "cnn": [1]}


def step_s(model, sync, codec, pulls, link):
    up = DENSE[model] * UP[codec]
    down = DENSE[model] * (0.2 if pulls == "on" else 1.0)
    comm = (up + down) * 8 / (link * 1e9) * 2  # 4 workers share 2 shards' links
    if sync == "local4":
        comm /= 4
    if sync == "asp":
        comm *= 0.8
    return round(COMPUTE_S[model] + comm, 6), int(up), int(down)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "grid")
    os.makedirs(out, exist_ok=True)
    lines, curves = [], []
    for model, sync, codec, pulls, tau, plateau, failed in RUNS:
        for link in LINKS[model]:
            run_id = f"{model}-{sync}-{codec}-pull{pulls}-{link:g}g"
            s, up, down = step_s(model, sync, codec, pulls, link)
            points = []
            last = STEPS if not failed else 2 * EVERY
            for step in range(EVERY, last + 1, EVERY):
                acc = round(plateau - (plateau - 0.1) * math.exp(-step / tau), 4)
                loss = round(2.0 * math.exp(-step / tau) + 0.3 + (0.89 - plateau), 4)
                points.append((step, round(step * s, 4), loss, acc, up * step, down * step))
            for p in points:
                curves.append([run_id, model, sync, codec, pulls, f"{link:g}", *p])
            ttt, stt = -1, -1
            for step, wall, _, acc, _, _ in points:
                if acc >= TARGET[model]:
                    ttt, stt = wall, step
                    break
            row = {"bench": "convergence", "run_id": run_id, "model": model, "sync": sync, "codec": codec,
                   "codec_spec": SPECS[codec], "pull_codec": "topk:ratio=0.1" if pulls == "on" else "none",
                   "link_gbps": link, "link_measured_gbps": round(link * 0.94, 3), "workers": 4, "shards": 2,
                   "batch_size": 64, "target_accuracy": TARGET[model]}
            if failed:
                row.update({k: -1 for k in KEYS[13:23]})
                row.update({"status": "failed", "error": "harrier-worker rank 2 exited with status 134 (fixture)"})
            else:
                row.update({"time_to_target_s": ttt, "steps_to_target": stt, "final_accuracy": points[-1][3],
                            "best_accuracy": max(p[3] for p in points), "final_loss": points[-1][2],
                            "steps": STEPS, "wall_s": round(STEPS * s * 1.1 + 3.0, 3), "step_s": s,
                            "bytes_up_per_step": up, "bytes_down_per_step": down, "status": "ok", "error": ""})
            lines.append({k: row[k] for k in KEYS})
    with open(os.path.join(out, "runs.jsonl"), "w") as f:
        f.writelines(json.dumps(l, separators=(",", ":")) + "\n" for l in lines)
    # codec_spec has commas (qsgd:levels=127,bucket=512): quoted, RFC 4180.
    with open(os.path.join(out, "runs.csv"), "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(KEYS)
        for l in lines:
            writer.writerow([f"{l[k]:g}" if isinstance(l[k], float) else str(l[k]) for k in KEYS])
    with open(os.path.join(out, "curves.csv"), "w") as f:
        f.write("run_id,model,sync,codec,pulls,link_gbps,step,wall_s,loss,accuracy,bytes_up,bytes_down\n")
        for c in curves:
            f.write(",".join(str(v) for v in c) + "\n")
    with open(os.path.join(out, "FIXTURE"), "w") as f:
        f.write("Made-up curves (make_fixture.py): 9 configurations over 1 and 10 Gbit/s, one failed run, "
                "one that never reaches its target.\n")
    with open(os.path.join(out, "grid_args.txt"), "w") as f:
        f.write("fixture: --models=mlp,cnn --syncs=bsp,ssp2,asp,local4 --epochs=1 --max_steps=300 --eval_every=20\n")
    with open(os.path.join(out, "machine.txt"), "w") as f:
        f.write("fixture (no machine: hand-made data)\n")
    # The advisor's picks: rank 1 on mlp 1g, rank 2 on mlp 10g, rank 1 on cnn 1g.
    for model, link, sync, codec, predicted in (("mlp", 1, "local4", "qsgd8", 1.6), ("mlp", 10, "bsp", "topk", 0.9),
                                                ("cnn", 1, "bsp", "efsign", 12.0)):
        advice = {"bench": "advise", "model": model, "link_gbps_measured_up": link * 0.93,
                  "link_gbps_measured_down": link * 0.95, "rtt_ms": 0.21,
                  "pick": {"sync": sync, "codec": codec, "pulls": "off", "pull_codec": "none",
                           "techniques": "none", "predicted_time_to_target_s": predicted},
                  "options": [{"sync": sync, "codec": codec, "pulls": "off", "predicted_step_s": 0.01,
                               "predicted_steps": 180, "predicted_time_to_target_s": predicted}]}
        with open(os.path.join(out, f"advice-{model}-{link:g}g.jsonl"), "w") as f:
            f.write("harrier-advise: (human table on stderr in the real binary)\n")
            f.write(json.dumps(advice, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
