#!/usr/bin/python3
"""Writes a runs.jsonl calibration fixture for advise_e2e_test.sh: every
option of the grid (4 syncs x 13 codecs x 2 pulls, links 1 and 10 Gbit/s)
reached the target in --steps steps, except --best (SYNC/CODEC/PULLS,
--best_steps steps) and --never options (never reached: steps -1).

usage: make_calibration.py --out=FILE --best=bsp/topk/off [--best_steps=20]
       [--steps=5000] [--never=asp/signsgd/off,...] [--model=mlp] [--help]
"""
import json
import sys

SYNCS = ["bsp", "ssp2", "asp", "local4"]
CODECS = ["none", "fp16", "topk", "randomk", "dgc", "qsgd4", "qsgd8", "terngrad",
          "signsgd", "efsign", "signum", "onebit", "powersgd2"]
KEYS = ["bench", "run_id", "model", "sync", "codec", "codec_spec", "pull_codec", "link_gbps",
        "link_measured_gbps", "workers", "shards", "batch_size", "target_accuracy",
        "time_to_target_s", "steps_to_target", "final_accuracy", "best_accuracy", "final_loss",
        "steps", "wall_s", "step_s", "bytes_up_per_step", "bytes_down_per_step", "status",
        "error"]


def main(argv):
    args = {"best_steps": "20", "steps": "5000", "never": "", "model": "mlp"}
    for arg in argv[1:]:
        if arg in ("--help", "-h"):
            print(__doc__)
            return 0
        if not arg.startswith("--") or "=" not in arg:
            print("make_calibration.py: bad argument %r" % arg, file=sys.stderr)
            return 2
        key, value = arg[2:].split("=", 1)
        args[key] = value
    if "out" not in args or "best" not in args:
        print("make_calibration.py: --out and --best are required", file=sys.stderr)
        return 2
    never = set(filter(None, args["never"].split(",")))
    with open(args["out"], "w") as out:
        for link in (1, 10):
            for sync in SYNCS:
                for codec in CODECS:
                    for pulls in ("off", "on"):
                        option = "%s/%s/%s" % (sync, codec, pulls)
                        steps = float(args["steps"])
                        if option == args["best"]:
                            steps = float(args["best_steps"])
                        if option in never:
                            steps = -1
                        run = {k: -1 for k in KEYS}
                        run.update({
                            "bench": "convergence",
                            "run_id": "%s-%s-%s-pull%s-%gg" % (args["model"], sync, codec,
                                                              pulls, link),
                            "model": args["model"], "sync": sync, "codec": codec,
                            "codec_spec": "", "pull_codec": "none",
                            "link_gbps": link, "workers": 4, "shards": 2, "batch_size": 64,
                            "target_accuracy": 0.85, "steps_to_target": steps,
                            "status": "ok", "error": ""})
                        out.write(json.dumps(run) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
