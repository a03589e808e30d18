"""Train the real runs: a fixed matrix of models, optimizers, schedules and stopping rules.

Needs PyTorch and scikit-learn, which are not project dependencies (a script-only extra):

    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch numpy scikit-learn
    for w in 1 2; do nice -n 19 /tmp/torchvenv/bin/python -m benchmarks.curves.train_runs run --out /tmp/rr & done
    python -m benchmarks.curves.real_curves /tmp/rr benchmarks/data/real_curves   # pack; no torch

`--matrix long`, `long3` and `long4` (each with its own --out) train the second, third and fourth
campaigns, runs of one to five CPU minutes packed together into benchmarks/data/real_curves_long;
`--matrix tune5` the fifth, early-stopping runs of job_end_eval's tuning families, packed with them;
`--matrix gpu --device cuda` the GPU campaign (benchmarks/gpu_runs.py runs it, reported live); the
default short matrix is the shipped real_curves, unchanged.

Each run writes <out>/<run_id>.json as it ends (a killed campaign keeps what it finished; a
rerun skips runs already written). One thread per run: the step times are a single core's.
Every point carries two clocks: wall seconds, and the training thread's CPU seconds
(time.thread_time: the job's own work, evaluation and batching included, not the neighbours'
load on a shared machine). Several workers may share one --out: each claims a run with an
exclusive <run_id>.claim file before training it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.curves.stopping import EarlyStopping, reached

# family -> (dataset, model kind, batch size, planned-step range, eval every, (target series, target))
FAMILIES: dict[str, tuple[str, str, int, tuple[int, int], int, tuple[str, float]]] = {
    "digits_mlp": ("digits", "mlp", 128, (600, 2000), 25, ("val_acc", 0.965)),
    "digits_cnn": ("digits", "cnn", 64, (500, 1200), 25, ("val_acc", 0.985)),
    "cancer_logreg": ("breast_cancer", "logreg", 64, (600, 2500), 25, ("val_loss", 0.11)),
    "wine_mlp": ("wine", "mlp", 32, (500, 1500), 20, ("val_loss", 0.06)),
    "synth_cls_mlp": ("synth_cls", "mlp", 128, (800, 2500), 50, ("val_acc", 0.73)),
    "synth_reg_mlp": ("synth_reg", "mlp", 128, (800, 2500), 50, ("val_mse", 2.0)),
    "chars_gru": ("stdlib_chars", "gru", 16, (500, 1000), 50, ("val_loss", 2.3)),
    "chars_lstm": ("stdlib_chars", "lstm", 16, (500, 1000), 50, ("val_loss", 2.35)),
    "chars_transformer": ("stdlib_chars", "transformer", 16, (500, 1000), 50, ("val_loss", 2.35)),
}
# The long campaign (--matrix long): the same tasks, bigger batches and models, planned runs of 1-1.5 CPU minutes
# (sized from measured seconds per step on one thread). Same tuple as FAMILIES; synthbig_* are
# new families (not in job_end_eval's TUNE_FAMILIES), with more data so a wide model learns for minutes.
LONG_FAMILIES: dict[str, tuple[str, str, int, tuple[int, int], int, tuple[str, float]]] = {
    "chars_transformer": ("stdlib_chars", "transformer", 64, (4500, 8000), 100, ("val_loss", 1.9)),
    "chars_lstm": ("stdlib_chars", "lstm", 32, (10000, 17000), 200, ("val_loss", 2.0)),
    "chars_gru": ("stdlib_chars", "gru", 32, (7000, 12000), 200, ("val_loss", 1.95)),
    "digits_cnn": ("digits", "cnn", 256, (4500, 8000), 100, ("val_acc", 0.99)),
    "synthbig_cls_mlp": ("synth_cls_big", "mlp_wide", 256, (4000, 7000), 250, ("val_acc", 0.85)),
    "synthbig_reg_mlp": ("synth_reg_big", "mlp_wide", 256, (4500, 8000), 250, ("val_mse", 1.5)),
}
LONG_MASTER_SEED = 3535
LONG_SEED_BASE = 5000
LONG_RUNS_PER_RULE = 2
# The third campaign (--matrix long3, packed with the second into real_curves_long): the long families
# with plans 1.3x longer (planned runs of about 1.2-2 CPU minutes), three runs per (family, rule),
# early-stopping and target runs capped at twice the longest plan and early stopping more patient
# (as jobs that validate often are), so that rule-ended runs, too, last minutes. Fixed before any run.
LONG3_MASTER_SEED = 3737
LONG3_SEED_BASE = 7000
LONG3_RUNS_PER_RULE = 3
LONG3_STEP_SCALE = 1.3
LONG3_PATIENCE = (5, 8, 10, 15)
# The fourth campaign (--matrix long4, packed with the second and third): plans 1.6x the long ones
# (about 1.5-2.5 CPU minutes), two runs per (family, rule) of planned end, early stopping (patient:
# 8-20 evaluations) and no rule, the rules whose runs last minutes; fixed before any run.
LONG4_MASTER_SEED = 3838
LONG4_SEED_BASE = 11000
LONG4_RUNS_PER_RULE = 2
LONG4_STEP_SCALE = 1.6
LONG4_PATIENCE = (8, 10, 15, 20)
LONG4_RULES = ("planned", "early_stopping", "none")
# The fifth campaign (--matrix tune5, packed with the long ones): early-stopping runs of the families
# job_end_eval tunes on (its TUNE_FAMILIES) only, so that the early-stopping forecast is chosen on more
# than the 19 runs those families had: chars_gru at the long4 scale, the short tuning families with plans
# TUNE5_SHORT_SCALE x theirs (more evaluations); patient early stopping as in long4. Fixed before any run.
TUNE5_MASTER_SEED = 3939
TUNE5_SEED_BASE = 13000
TUNE5_RUNS_PER_RULE = 6
TUNE5_SHORT_SCALE = 4.0
TUNE5_SHORT_FAMILIES = ("digits_mlp", "cancer_logreg", "synth_reg_mlp")
# The GPU campaign (--matrix gpu --device cuda, whenever a GPU is lent): models sized so that a step
# is a GPU's work; plans are given in seconds (GPU_PLAN_S) because a step's time is known only on
# the device: each run times 20 steps of a throwaway copy of its model first and sets its plan to
# the seconds drawn / that step time (recorded in the run's spec). Rules: the three.
GPU_FAMILIES: dict[str, tuple[str, str, int, tuple[int, int], int, tuple[str, float]]] = {
    "gpu_chars_gpt": ("stdlib_chars", "gpt", 64, (0, 0), 100, ("val_loss", 1.5)),
    "gpu_chars_lstm": ("stdlib_chars", "lstm_big", 128, (0, 0), 100, ("val_loss", 1.6)),
    "gpu_synth_mlp": ("synth_cls_big", "mlp_huge", 1024, (0, 0), 100, ("val_acc", 0.85)),
}
GPU_PLAN_S = (40.0, 80.0)  # seconds
GPU_MASTER_SEED = 4040
GPU_SEED_BASE = 9000
GPU_RUNS_PER_RULE = 2
GPU_RULES = ("planned", "early_stopping", "none")
# The second session's GPU matrix (--matrix gpu2, run 2026-11-27 10:10-10:19 UTC): the same families and rules,
# new draws and seeds, fixed before any of its runs
GPU2_MASTER_SEED = 4141
GPU2_SEED_BASE = 9100
# The third session's (--matrix gpu3): early stopping only, the rule whose GPU figures rest on the fewest
# runs (14 in the first two) and miss most; GPU3_RUNS_PER_RULE per family, new draws and seeds, fixed
# before any of its runs
GPU3_MASTER_SEED = 4242
GPU3_SEED_BASE = 9200
GPU3_RUNS_PER_RULE = 4
RULES = ("planned", "early_stopping", "target", "none")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
SCHEDULES = ("constant", "cosine", "step", "onecycle")
LR_RANGE = {"sgd": (0.02, 0.3), "momentum": (0.003, 0.05), "adam": (3e-4, 3e-3), "adamw": (3e-4, 3e-3)}
RUNS_PER_RULE = 3
CAP_FACTOR = 2  # early-stopping and target runs may run to CAP_FACTOR x the family's longest plan
TRAIN_COLUMNS = ("step", "wall_s", "loss", "cpu_s")  # cpu_s last: files written before it read the same
EVAL_COLUMNS = ("step", "wall_s", "val_loss", "val_metric", "cpu_s")


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    family: str
    dataset: str
    model: str
    optimizer: str
    lr: float
    schedule: str
    batch_size: int
    seed: int
    rule: str  # planned | early_stopping | target | none
    max_steps: int  # the planned end; the cap for early_stopping/target; the unknown end for none
    eval_every: int
    monitor: str  # the series the rule watches: val_loss or the task's metric
    higher_is_better: bool
    patience: int = 0
    min_delta: float = 0.0
    target: float = math.nan
    plan_s: float = 0.0  # > 0: max_steps is set on the device from this and a timed step (GPU campaign)
    device: str = "cpu"


def run_matrix(master_seed: int = 35) -> list[RunSpec]:
    """Every (family, rule) gets RUNS_PER_RULE runs; optimizer x schedule cycle, the rest drawn from the seed."""
    return _matrix(FAMILIES, RUNS_PER_RULE, CAP_FACTOR, master_seed, seed_base=1000, id_suffix="")


def long_matrix(master_seed: int = LONG_MASTER_SEED) -> list[RunSpec]:
    """The long campaign: LONG_RUNS_PER_RULE runs per (family, rule), capped at the family's longest plan."""
    return _matrix(LONG_FAMILIES, LONG_RUNS_PER_RULE, 1, master_seed, seed_base=LONG_SEED_BASE, id_suffix="-long")


def long3_matrix(master_seed: int = LONG3_MASTER_SEED) -> list[RunSpec]:
    """The third campaign: LONG3_RUNS_PER_RULE runs per (family, rule) of the long families, plans scaled."""
    families = {f: _scaled_family(fam, LONG3_STEP_SCALE) for f, fam in LONG_FAMILIES.items()}
    return _matrix(families, LONG3_RUNS_PER_RULE, CAP_FACTOR, master_seed, seed_base=LONG3_SEED_BASE,
                   id_suffix="-long3", patience=LONG3_PATIENCE)


def long4_matrix(master_seed: int = LONG4_MASTER_SEED) -> list[RunSpec]:
    """The fourth campaign: LONG4_RUNS_PER_RULE runs per (family, rule in LONG4_RULES), plans scaled 1.6x."""
    families = {f: _scaled_family(fam, LONG4_STEP_SCALE) for f, fam in LONG_FAMILIES.items()}
    return [s for s in _matrix(families, LONG4_RUNS_PER_RULE, CAP_FACTOR, master_seed, seed_base=LONG4_SEED_BASE,
                               id_suffix="-long4", patience=LONG4_PATIENCE) if s.rule in LONG4_RULES]


def tune5_matrix(master_seed: int = TUNE5_MASTER_SEED) -> list[RunSpec]:
    """The fifth campaign: TUNE5_RUNS_PER_RULE early-stopping runs of each tuning family (chars_gru scaled
    as long4, TUNE5_SHORT_FAMILIES' plans x TUNE5_SHORT_SCALE)."""
    families = {"chars_gru": _scaled_family(LONG_FAMILIES["chars_gru"], LONG4_STEP_SCALE)}
    families |= {f: _scaled_family(FAMILIES[f], TUNE5_SHORT_SCALE) for f in TUNE5_SHORT_FAMILIES}
    return [s for s in _matrix(families, TUNE5_RUNS_PER_RULE, CAP_FACTOR, master_seed, seed_base=TUNE5_SEED_BASE,
                               id_suffix="-tune5", patience=LONG4_PATIENCE) if s.rule == "early_stopping"]


def _scaled_family(family: tuple[str, str, int, tuple[int, int], int, tuple[str, float]], scale: float
                   ) -> tuple[str, str, int, tuple[int, int], int, tuple[str, float]]:
    """A family's tuple with its planned-step range scaled (to 50 steps)."""
    dataset, model, batch, (lo, hi), every, target = family
    return dataset, model, batch, (_scaled(lo, scale), _scaled(hi, scale)), every, target


def gpu_matrix(master_seed: int = GPU_MASTER_SEED, seed_base: int = GPU_SEED_BASE,
               id_suffix: str = "-gpu", runs_per_rule: int = GPU_RUNS_PER_RULE,
               rules: tuple[str, ...] = GPU_RULES) -> list[RunSpec]:
    """The GPU campaign: runs_per_rule runs per (family, rule in rules), plans drawn in seconds."""
    rng = random.Random(master_seed)
    specs = [s for s in _matrix(GPU_FAMILIES, runs_per_rule, CAP_FACTOR, master_seed, seed_base=seed_base,
                                id_suffix=id_suffix) if s.rule in rules]
    return [replace(s, plan_s=round(rng.uniform(*GPU_PLAN_S), 1), device="cuda") for s in specs]


def gpu2_matrix() -> list[RunSpec]:
    """The second session's GPU matrix: the GPU campaign's families and rules with new draws and seeds."""
    return gpu_matrix(GPU2_MASTER_SEED, GPU2_SEED_BASE, "-gpu2")


def gpu3_matrix() -> list[RunSpec]:
    """The third session's GPU matrix: early-stopping runs of the GPU families, new draws and seeds."""
    return gpu_matrix(GPU3_MASTER_SEED, GPU3_SEED_BASE, "-gpu3", GPU3_RUNS_PER_RULE, ("early_stopping",))


# --matrix NAME: each campaign's runs (gpu_runs.py starts the GPU ones by the same names)
MATRICES = {"short": run_matrix, "long": long_matrix, "long3": long3_matrix, "long4": long4_matrix,
            "tune5": tune5_matrix, "gpu": gpu_matrix, "gpu2": gpu2_matrix, "gpu3": gpu3_matrix}


def _scaled(steps: int, scale: float) -> int:
    return round(steps * scale / 50.0) * 50


def _matrix(families: dict[str, tuple[str, str, int, tuple[int, int], int, tuple[str, float]]], runs_per_rule: int,
            cap_factor: int, master_seed: int, seed_base: int, id_suffix: str,
            patience: tuple[int, ...] = (3, 5, 8, 10)) -> list[RunSpec]:
    rng = random.Random(master_seed)
    specs: list[RunSpec] = []
    for fi, (family, (dataset, model, batch, (lo, hi), every, (target_series, target))) in enumerate(families.items()):
        metric_hib = not dataset.startswith(("synth_reg", "stdlib_chars"))
        metric = "val_acc" if metric_hib else ("val_mse" if dataset.startswith("synth_reg") else "val_loss")
        for ri, rule in enumerate(RULES):
            for k in range(runs_per_rule):
                n = len(specs)
                opt = OPTIMIZERS[(fi + ri + k) % 4]
                sched = SCHEDULES[(fi + 2 * ri + 3 * k) % 4]
                a, b = LR_RANGE[opt]
                lr = math.exp(rng.uniform(math.log(a), math.log(b)))
                planned = rng.randrange(lo, hi + 1, 50)
                common: dict[str, Any] = dict(
                    run_id=f"{family}-{rule}-{k}{id_suffix}", family=family, dataset=dataset, model=model,
                    optimizer=opt, lr=round(lr, 6), schedule=sched, batch_size=batch, seed=seed_base + n, rule=rule,
                    eval_every=every,
                )
                if rule in ("planned", "none"):
                    specs.append(RunSpec(**common, max_steps=planned, monitor="val_loss", higher_is_better=False))
                elif rule == "early_stopping":
                    # monitor val_loss mostly; one run per family watches the task metric, as jobs do
                    watch_metric = k == 2 and metric_hib
                    specs.append(RunSpec(
                        **common, max_steps=cap_factor * hi, monitor=metric if watch_metric else "val_loss",
                        higher_is_better=watch_metric, patience=rng.choice(patience),
                        min_delta=rng.choice((0.0, 1e-3, 1e-2)) / (100 if watch_metric else 1),
                    ))
                else:
                    specs.append(RunSpec(
                        **common, max_steps=cap_factor * hi, monitor=target_series,
                        higher_is_better=target_series == "val_acc", target=target,
                    ))
    return specs


def _optimizer(torch: Any, spec: RunSpec, params: Any) -> Any:
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=spec.lr)
    if spec.optimizer == "momentum":
        return torch.optim.SGD(params, lr=spec.lr, momentum=0.9, nesterov=True)
    if spec.optimizer == "adam":
        return torch.optim.Adam(params, lr=spec.lr)
    return torch.optim.AdamW(params, lr=spec.lr, weight_decay=0.05)


def _scheduler(torch: Any, spec: RunSpec, opt: Any) -> Any:
    s, n = spec.schedule, spec.max_steps
    if s == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=n)
    if s == "step":
        return torch.optim.lr_scheduler.StepLR(opt, step_size=max(1, n // 3), gamma=0.3)
    if s == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=spec.lr, total_steps=n + 1)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)


def _timed_step_s(torch: Any, spec: RunSpec, task: Any, model: Any) -> float:
    """Seconds a step of this run takes here: 20 timed steps (after 5) of a throwaway copy."""
    import copy

    probe = copy.deepcopy(model)
    opt = _optimizer(torch, spec, probe.parameters())
    gen = torch.Generator().manual_seed(spec.seed + 1)
    t0 = 0.0
    for i in range(25):
        if i == 5:
            t0 = time.perf_counter()
        x, y = task.batch(gen, spec.batch_size)
        loss = task.loss(probe(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
    return (time.perf_counter() - t0) / 20


def _planned_on_device(spec: RunSpec, step_s: float) -> RunSpec:
    """The GPU campaign's plan in steps: plan_s / step_s, to 50 steps; rule-ended runs capped at
    CAP_FACTOR x the longest plan, as in the other campaigns."""
    planned = max(200, round(spec.plan_s / step_s / 50) * 50)
    cap = max(200, round(CAP_FACTOR * GPU_PLAN_S[1] / step_s / 50) * 50)
    return replace(spec, max_steps=planned if spec.rule in ("planned", "none") else cap)


def declare_rule(reporter: Any, spec: RunSpec) -> None:
    """Tell flowsched the run's stopping rule as a job would (Reporter.training); none: nothing."""
    if spec.rule == "planned":
        reporter.training(max_steps=spec.max_steps)
    elif spec.rule == "early_stopping":
        reporter.training(early_stopping={"patience": spec.patience, "min_delta": spec.min_delta,
                                          "metric": spec.monitor, "higher_is_better": spec.higher_is_better})


def train(spec: RunSpec, reporter: Any = None) -> dict[str, Any]:
    """reporter: a flowsched_client Reporter the run reports to as it trains (every step's loss
    tensor; each evaluation's monitored value as metrics[monitor]), after declaring its rule."""
    import torch

    from benchmarks.curves.tasks import GPU_TEXT_SEQ, SEQ_LEN, make_task

    torch.manual_seed(spec.seed)
    if spec.device.startswith("cuda"):  # TF32 matrix products, as GPU training runs them
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    task = make_task(spec.dataset, spec.seed, spec.device, GPU_TEXT_SEQ.get(spec.model, SEQ_LEN))
    model = task.build(spec.model).to(spec.device)
    step_s = math.nan
    if spec.plan_s > 0:
        step_s = _timed_step_s(torch, spec, task, model)
        spec = _planned_on_device(spec, step_s)
    opt = _optimizer(torch, spec, model.parameters())
    sched = _scheduler(torch, spec, opt)
    gen = torch.Generator().manual_seed(spec.seed)
    if reporter is not None:
        declare_rule(reporter, spec)
    es = EarlyStopping(spec.patience, spec.min_delta, spec.higher_is_better) if spec.rule == "early_stopping" else None
    train_rows: list[tuple[int, float, float, float]] = []  # TRAIN_COLUMNS
    eval_rows: list[tuple[int, float, float, float, float]] = []  # EVAL_COLUMNS
    stopped_by = "max_steps"
    started_at = time.time()
    t0, c0 = time.perf_counter(), time.thread_time()
    for step in range(1, spec.max_steps + 1):
        model.train()
        x, y = task.batch(gen, spec.batch_size)
        loss = task.loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if reporter is not None and step % spec.eval_every:  # an evaluation step reports below, with it
            reporter.report(step, loss)  # the tensor, as a GPU loop would pass it
        value = loss.item()
        train_rows.append((step, round(time.perf_counter() - t0, 4), round(value, 5),
                           round(time.thread_time() - c0, 4)))
        if not math.isfinite(value):
            stopped_by = "diverged"
            break
        if step % spec.eval_every == 0:
            model.eval()
            val_loss, val_metric = task.evaluate(model)
            eval_rows.append((step, round(time.perf_counter() - t0, 4), round(val_loss, 5), round(val_metric, 5),
                              round(time.thread_time() - c0, 4)))
            watched = val_loss if spec.monitor == "val_loss" else val_metric
            if reporter is not None:
                reporter.report(step, loss, metrics={spec.monitor: watched})
            if es is not None and es.should_stop(watched):
                stopped_by = "early_stopping"
                break
            if spec.rule == "target" and reached(watched, spec.target, spec.higher_is_better):
                stopped_by = "target"
                break
    end_s, end_cpu = time.perf_counter() - t0, time.thread_time() - c0
    ended_at = time.time()
    device: dict[str, Any] = {}
    if spec.plan_s > 0:
        device = {"timed_step_s": round(step_s, 6), "started_at": started_at, "ended_at": ended_at}
    if spec.device.startswith("cuda"):
        device["gpu"] = torch.cuda.get_device_name()
    return {**device,
        "spec": asdict(spec), "train": train_rows, "evals": eval_rows, "stopped_by": stopped_by,
        "true_end_step": train_rows[-1][0], "true_end_seconds": round(end_s, 4),
        "true_end_cpu_seconds": round(end_cpu, 4), "columns": {"train": TRAIN_COLUMNS, "evals": EVAL_COLUMNS},
        "torch": torch.__version__, "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
    }


def _claim(path: Path) -> bool:
    """True if this worker now owns the run (another worker sharing --out holds it otherwise)."""
    try:
        with path.open("x") as f:
            f.write(str(os.getpid()))
    except FileExistsError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train the matrix (or --only some runs), one JSON per run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--only", nargs="*", default=None, help="run ids or family names")
    r.add_argument("--order", choices=("matrix", "interleave"), default="interleave",
                   help="interleave families so a partial campaign covers them all")
    ls = sub.add_parser("list", help="print the matrix")
    for a in (r, ls):
        a.add_argument("--matrix", choices=tuple(MATRICES), default="short",
                       help="short: the shipped real_curves (seconds per run); long, long3, long4: "
                            "real_curves_long (minutes); tune5: early-stopping runs of the tuning families, "
                            "packed with the long ones; gpu, gpu2, gpu3: the GPU campaign's sittings (need CUDA)")
    r.add_argument("--device", default=None, help="override the matrix's device (cpu: smoke-test the GPU matrix)")
    r.add_argument("--report", nargs=3, metavar=("URL", "TOKEN", "NAMESPACE"), default=None,
                   help="report each run live to a flowsched API (job = run id), its rule declared")
    args = p.parse_args(argv)
    specs = MATRICES[args.matrix]()
    if args.cmd == "list":
        for s in specs:
            print(json.dumps(asdict(s)))
        return 0
    import torch

    torch.set_num_threads(1)
    if args.only:
        specs = [s for s in specs if s.run_id in args.only or s.family in args.only]
    if args.device:
        specs = [replace(s, device=args.device) for s in specs]
    if args.order == "interleave" and args.matrix != "short":  # a diagonal: each stretch covers families and rules
        fam, rule = list(dict.fromkeys(s.family for s in specs)), list(RULES)
        specs = sorted(specs, key=lambda s: (int(s.run_id.rsplit("-", 2)[1]),  # every k-th run before any (k+1)-th
                                             (rule.index(s.rule) - fam.index(s.family)) % len(RULES),
                                             fam.index(s.family)))
    elif args.order == "interleave":  # k-th run of every family before the (k+1)-th of any
        pos = {s.run_id: i % (len(RULES) * RUNS_PER_RULE) for i, s in enumerate(specs)}
        specs = sorted(specs, key=lambda s: (pos[s.run_id] % RUNS_PER_RULE, pos[s.run_id] // RUNS_PER_RULE, s.family))
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        path = args.out / f"{spec.run_id}.json"
        if path.exists() or not _claim(path.with_suffix(".claim")):
            continue
        reporter = None
        if args.report:
            from flowsched_client import Reporter, ReporterConfig

            url, token, namespace = args.report
            reporter = Reporter(ReporterConfig(url=url, job=spec.run_id, namespace=namespace, token=token,
                                               higher_is_better=False))
        rec = train(spec, reporter)
        if reporter is not None:
            reporter.close()
            rec["reported"] = {"sent": reporter.sent, "dropped": reporter.dropped}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec, separators=(",", ":")))
        tmp.replace(path)
        path.with_suffix(".claim").unlink(missing_ok=True)
        end = f"step {rec['true_end_step']} after {rec['true_end_seconds']:.1f} s"
        print(f"{spec.run_id}: {rec['stopped_by']} at {end}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
