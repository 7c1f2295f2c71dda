#!/usr/bin/env python3
"""Bounded soak of the store tier: generations against two kv-stores holding every shard twice
(--replicas 2) and keeping their sessions on disk (--data-dir), while stores are killed with
SIGKILL at random moments and restarted from their directories.

Checked: every generation completes with the tokens of an undisturbed reference run (no loss),
no session is left on the stores or on their disks once the last generation ended and the idle
lease ran out, and each store's RSS is back near its fresh-start baseline. Prints and writes a
JSON report; exits 1 when a check fails.

  soak.py --gpu-worker build/bin/gpu-worker --kv-store build/bin/kv-store \
          --model models/SmolLM2-135M-Instruct.Q4_1.gguf [--seconds 600] [--seed 1] [--out FILE]
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

PROMPT = ("The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid. "
          "The capital of Germany is Berlin. The capital of Portugal is")
IDLE_S = 3  # the stores' --session-idle-timeout: what a worker that lost a store leaves there expires


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


class Store:
    def __init__(self, binary, run, name):
        self.binary, self.name = binary, name
        self.addr = f"127.0.0.1:{free_port()}"
        self.data = os.path.join(run, f"{name}.data")
        self.log = open(os.path.join(run, f"{name}.log"), "ab")
        self.proc = None
        self.starts = 0

    def start(self):
        ready = os.path.join(os.path.dirname(self.data), f"{self.name}.ready")
        if os.path.exists(ready):
            os.remove(ready)
        self.proc = subprocess.Popen(
            [self.binary, "--listen", self.addr, "--memory-budget", "256M", "--threads", "1", "--data-dir", self.data,
             "--session-idle-timeout", str(IDLE_S), "--ready-file", ready],
            stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(200):
            if os.path.exists(ready):
                self.starts += 1
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"store {self.name} did not start")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)

    def sessions_on_disk(self):
        return sorted(d for d in os.listdir(self.data) if len(d) == 32) if os.path.isdir(self.data) else []


def generate(args, stores, json_path, n_tokens):
    cmd = [args.gpu_worker, "generate", "--backend", "cpu", "--threads", "2", "--model", args.model, "--prompt",
           PROMPT, "--max-new-tokens", str(n_tokens), "--no-stop", "--mode", "flat", "--attn-top-k", "4096",
           "--sink", "4", "--window", "8", "--stores", ",".join(s.addr for s in stores), "--replicas", "2",
           "--store-reconnect-ms", "20000", "--json", json_path]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu-worker", required=True)
    ap.add_argument("--kv-store", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--seconds", type=float, default=600.0, help="how long to soak (at most 600)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per generation")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="also write the JSON report here")
    args = ap.parse_args()
    if not 1 <= args.seconds <= 600:
        ap.error("--seconds must be 1 to 600")
    rng = random.Random(args.seed)
    run = tempfile.mkdtemp(prefix="soak.")
    stores = [Store(args.kv_store, run, n) for n in ("a", "b")]
    report = {"seconds": args.seconds, "seed": args.seed, "tokens_per_generation": args.tokens, "generations": 0,
              "generations_ok": 0, "failures": [], "kills": 0, "restarts": 0, "stores_marked_down": 0,
              "reattaches": 0}
    try:
        for s in stores:
            s.start()
        time.sleep(0.5)
        cold = {s.name: rss_kb(s.proc.pid) for s in stores}
        ref_path = os.path.join(run, "ref.json")
        ref = generate(args, stores, ref_path, args.tokens)
        if ref.wait() != 0:
            raise RuntimeError("the reference run failed: " + ref.stderr.read().decode(errors="replace"))
        ref_tokens = json.load(open(ref_path))["tokens"]
        # the baseline: a store that has served one generation and closed its sessions (its call
        # threads, gRPC's and the allocator's caches exist then, as in any serving store)
        time.sleep(0.5)
        baseline = {s.name: rss_kb(s.proc.pid) for s in stores}
        t_end = time.time() + args.seconds
        while time.time() < t_end:
            i = report["generations"]
            path = os.path.join(run, f"gen{i}.json")
            w = generate(args, stores, path, args.tokens)
            report["generations"] += 1
            # half the generations lose a store at a random moment; it comes back a little later
            victim = rng.choice(stores) if rng.random() < 0.5 else None
            if victim:
                time.sleep(rng.uniform(0.0, 1.5))
                if w.poll() is None:
                    victim.kill()
                    report["kills"] += 1
                    time.sleep(rng.uniform(0.0, 0.5))
                    victim.start()
                    report["restarts"] += 1
            err = w.communicate()[1].decode(errors="replace")
            if w.returncode != 0:
                report["failures"].append({"generation": i, "exit": w.returncode, "stderr": err[-2000:]})
                continue
            d = json.load(open(path))
            if d["tokens"] != ref_tokens:
                report["failures"].append({"generation": i, "tokens": d["tokens"], "want": ref_tokens})
                continue
            report["generations_ok"] += 1
            report["stores_marked_down"] += sum(h["down"] for h in d["store_health"])
            report["reattaches"] += sum(h["reconnects"] for h in d["store_health"])
        # sessions a worker could not close (a store down at its end) expire with the lease
        time.sleep(IDLE_S * 1.25 + 3)
        report["rss_cold_start_kb"] = cold
        report["rss_baseline_kb"] = baseline
        report["rss_end_kb"] = {s.name: rss_kb(s.proc.pid) for s in stores}
        report["sessions_left_on_disk"] = {s.name: len(s.sessions_on_disk()) for s in stores}
        # back to baseline: within 8 MiB + 10 % (allocator arenas of the call threads vary)
        rss_ok = all(report["rss_end_kb"][n] <= baseline[n] * 1.1 + 8 * 1024 for n in baseline)
        report["rss_back_to_baseline"] = rss_ok
        report["pass"] = (not report["failures"] and rss_ok and report["generations_ok"] > 0 and
                          not any(report["sessions_left_on_disk"].values()))
    finally:
        for s in stores:
            s.stop()
        shutil.rmtree(run, ignore_errors=True)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
