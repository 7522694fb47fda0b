"""Printed (text) log formats, read through their declared contracts (trainguard/ingest/formats/*.py).

    pytest -q -p no:xdist tests/test_text_contracts.py

Each format's log is generated here from its contract's `sample` lines (the writer's own format strings),
then varied the ways real logs vary: a logging prefix, ANSI colour codes, tqdm `\\r` redraws interleaved,
CRLF line ends, a config dump printed first, a truncated last line, a relaunch appended. Every variant must
read as the same loss curve on the same steps as the plain log. Then the semantics the contracts carry:
the plan and how a run ended against it, one step axis, settings that are not evaluations, metric names
from the log's own keys. No fixture is copied from a real log or a repository.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from trainguard.ingest.diagnose import diagnose_source
from trainguard.ingest.formats import all_formats
from trainguard.ingest.formats._text import TextRules, text_rules
from trainguard.ingest.textlog import read_text_log

pytestmark = pytest.mark.unit

STEPS = 60
BATCHES = 20  # batches in an epoch, for formats that count within epochs


def _loss(step: int) -> float:
    return round(3.0 * math.exp(-step / 40) + 0.5, 4)


def _values(step: int, total: int = STEPS) -> dict[str, Any]:
    epoch, batch = divmod(step, BATCHES)
    return {"step": step, "total": total, "epoch": epoch + 1, "epochs": total // BATCHES + 1, "batch": batch,
            "batches": BATCHES, "pct": 100 * batch / BATCHES, "samples": batch * 64, "size": BATCHES * 64,
            "loss": f"{_loss(step):.4f}", "val": f"{_loss(step) + 0.1:.4f}"}


def _step_lines(rules: TextRules) -> list[str]:
    """The sample lines a writer prints at each step: those that carry the loss (a table's rows with it)."""
    if any("{loss}" in s and s.startswith("|") for s in rules.sample):
        return list(rules.sample)  # OpenAI's logger: the whole table is one step's record
    return [s for s in rules.sample if "{loss}" in s and ("{step" in s or "{batch" in s)]


def _log(rules: TextRules, steps: range = range(1, STEPS + 1)) -> list[str]:
    return [line.format(**_values(s)) for s in steps for line in _step_lines(rules)]


STEPPED = [r for r in text_rules() if _step_lines(r)]


def _curve(path: Path) -> list[tuple[int, float]]:
    src = read_text_log(path)
    return [(e["step"], e["loss"]) for e in src.events if e["kind"] == "step" and e.get("loss") is not None]


def _write(tmp_path: Path, name: str, lines: list[str], *, end: str = "\n", raw: bytes | None = None) -> Path:
    p = tmp_path / name
    p.write_bytes(raw if raw is not None else (end.join(lines) + end).encode())
    return p


# -- every format's real-world variants, generated from its contract ------------------------------------


def test_every_printed_format_declares_a_contract_with_a_writer_and_sample_lines() -> None:
    names = {f.name for f in all_formats()}
    for rules in text_rules():
        assert rules.format in names
        assert rules.sample, f"{rules.format}: no sample lines to generate its logs from"
    contract = {f.name: f for f in all_formats()}
    for rules in text_rules():
        c = contract[rules.format]
        assert c.writer and c.step_axis and c.plan and c.completion


def test_every_printed_family_module_is_read_by_the_text_reader() -> None:
    # text_rules() imports the printed families by name: a family module left out of it would be ignored
    import trainguard.ingest.formats as package

    read = {r.format for r in text_rules()}
    for module in Path(package.__file__).parent.glob("*.py"):
        source = module.read_text()
        if "declare_text(" in source and not module.name.startswith("_"):
            names = {line.split('"')[1] for line in source.splitlines() if line.strip().startswith('format="')}
            assert names and names <= read, f"{module.name}: {names - read} not read"


@pytest.mark.parametrize("rules", STEPPED, ids=lambda r: r.format)
def test_a_formats_variants_read_as_the_same_curve(tmp_path: Path, rules: TextRules) -> None:
    plain = _log(rules)
    base = _curve(_write(tmp_path, "plain.log", plain))
    assert len(base) >= STEPS // 2, f"{rules.format}: the plain log read as {len(base)} loss rows"
    assert [v for _, v in base] == sorted((v for _, v in base), reverse=True)  # the generated curve falls

    prefixed = [f"2026-01-02 03:04:05,678 - train - INFO - {line}" for line in plain]
    assert _curve(_write(tmp_path, "prefix.log", prefixed)) == base
    coloured = [f"\x1b[32m{line}\x1b[0m" for line in plain]
    assert _curve(_write(tmp_path, "ansi.log", coloured)) == base
    assert _curve(_write(tmp_path, "crlf.log", plain, end="\r\n")) == base
    # a config dump printed first (values that must not become metrics, evaluations or steps)
    dump = ["Running with full config:", "SOLVER:", "  BASE_LR: 0.01", "TEST:", "  EVAL_PERIOD: 200",
            "Namespace(batch_size=64, lr=0.01, seed=3)", "warmup_epochs: 10"]
    assert _curve(_write(tmp_path, "dump.log", dump + plain)) == base
    # tqdm redraws (carriage returns, no postfix) between the lines
    bars = []
    for i, line in enumerate(plain):
        bars.append(f"\r  {i}%|##        | {i}/{len(plain)} [00:01<00:10,  9.00it/s]")
        bars.append("\n" + line)
    raw = "".join(bars).encode() + b"\n"
    assert _curve(_write(tmp_path, "tqdm.log", [], raw=raw)) == base
    # a truncated last line (a process killed mid-write): the curve up to it, read without a traceback
    cut = "\n".join(plain).encode()
    cut = cut[: len(cut) - max(4, len(plain[-1]) // 2)]
    assert _curve(_write(tmp_path, "cut.log", [], raw=cut))[: len(base) - 1] == base[:-1]


@pytest.mark.parametrize("rules", [r for r in STEPPED if "{step" in "".join(_step_lines(r))], ids=lambda r: r.format)
def test_a_resumed_run_appended_goes_on_from_its_checkpoint(tmp_path: Path, rules: TextRules) -> None:
    # killed at step 40, resumed from the checkpoint of step 30: steps 31-40 come twice, the first kept
    first = _log(rules, range(1, 41))
    second = _log(rules, range(31, STEPS + 1))
    banner = ["Traceback is not here: the first run was killed", "Resuming from checkpoint step 30"]
    curve = _curve(_write(tmp_path, "resumed.log", first + banner + second))
    steps = [s for s, _ in curve]
    assert steps == sorted(set(steps)) and steps[-1] == _curve(_write(tmp_path, "p.log", _log(rules)))[-1][0]


# -- plan and completion: "cut off at 18%" and "finished" are never the same verdict ---------------------


def _diagnose(tmp_path: Path, lines: list[str], name: str = "train.log") -> Any:
    return diagnose_source(read_text_log(_write(tmp_path, name, lines)))


def _severe(d: Any) -> list[str]:
    return [f.name for f in d.findings if f.severity in ("warning", "error")]


def _epochs(last: int, of: int, *, zero: bool = False) -> list[str]:
    out = []
    for e in range(0 if zero else 1, last + 1):
        out.append(f"Epoch {e}/{of}" if not zero else f"Epoch: [{e}][0]\tLoss {_loss(e):.4f} (3.0)\tLr: 0.1000")
        if not zero:
            out += [f"  Batch {b}/10  Loss: {_loss(e * 10 + b):.4f}" for b in range(1, 11)]
            out.append(f"Epoch {e} - Train Loss: {_loss(e * 10):.4f}, Val Loss: {_loss(e * 10) + 0.1:.4f}")
    return out


def test_a_log_cut_off_short_of_its_planned_epochs_says_how_far_it_got(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, _epochs(3, 500) + ["Epoch 4/500", "Learning rate: 2.0e-05"])
    unfinished = [f for f in d.findings if f.name == "log-ends-unfinished"]
    assert unfinished and unfinished[0].severity == "warning"
    assert "epoch 4 of 500 (1%)" in unfinished[0].summary
    assert d.state == "unfinished"


def test_a_log_that_ends_after_its_last_planned_epochs_evaluation_finished(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, _epochs(7, 7))
    assert d.state == "completed" and _severe(d) == []


def test_epochs_counted_from_zero_end_at_n_minus_one_of_a_config_dumps_plan(tmp_path: Path) -> None:
    dump = ["INFO - ============ Initialized logger ============", "                  epochs: 40",
            "           warmup_epochs: 10"]
    done = _diagnose(tmp_path, dump + _epochs(39, 40, zero=True), "done.log")
    assert done.state == "completed" and _severe(done) == []
    short = _diagnose(tmp_path, dump + _epochs(9, 40, zero=True), "short.log")
    f = [f for f in short.findings if f.name == "log-ends-unfinished"]
    assert f and f[0].severity == "warning" and "epoch 10 of 40" in f[0].summary


def test_a_command_lines_step_plan_makes_a_table_log_that_stops_early_cut_off(tmp_path: Path) -> None:
    rules = next(r for r in text_rules() if r.format == "openai logger table")
    head = ["python train.py --learning_steps 50000 --lr 0.0001"]
    d = _diagnose(tmp_path, head + _log(rules, range(1, 33)))
    f = [f for f in d.findings if f.name == "log-ends-unfinished"]
    assert f and f[0].severity == "warning" and "of 50,000" in f[0].summary


def test_an_off_cadence_evaluation_at_the_last_step_is_the_end(tmp_path: Path) -> None:
    # build-nanogpt's log.txt: evaluations every 25 steps, and once more at the last step (max_steps - 1)
    lines = []
    for step in range(0, 131):
        if step % 25 == 0 or step == 130:
            lines += [f"{step} val {_loss(step) + 0.1:.4f}", f"{step} hella 0.{2500 + step}"]
        lines.append(f"{step} train {_loss(step):.6f}")
    d = _diagnose(tmp_path, lines, "log.txt")
    assert d.state == "completed" and _severe(d) == []
    cut = _diagnose(tmp_path, lines[: lines.index("120 train " + f"{_loss(120):.6f}") + 1], "cut.txt")
    assert cut.state == "unfinished"


def test_early_stopping_is_a_planned_end_and_its_rounded_bests_are_not_a_frozen_metric(tmp_path: Path) -> None:
    lines = ["Metric val_loss improved. New best score: 0.090"]
    for best in (0.050, 0.030, 0.023, 0.023, 0.023, 0.023, 0.022, 0.022, 0.021):
        lines.append(f"Metric val_loss improved by 0.000 >= min_delta = 0.0. New best score: {best:.3f}")
    lines.append("Monitored metric val_loss did not improve in the last 5 records. Best score: 0.021. "
                 "Signaling Trainer to stop.")
    d = _diagnose(tmp_path, lines, "model.out")
    assert d.state == "completed" and _severe(d) == [] and d.evals == 6


# -- one step axis -------------------------------------------------------------------------------------


def _mnist(batch_size: int | None) -> list[str]:
    lines = [f"Namespace(batch_size={batch_size}, epochs=2, lr=1.0)"] if batch_size else []
    for epoch in (1, 2):
        for batch_idx in range(0, 938, 10):
            done = batch_idx * 64
            lines.append(f"Train Epoch: {epoch} [{done}/60000 ({100. * batch_idx / 938:.0f}%)]\tLoss: "
                         f"{_loss(epoch * 94 + batch_idx // 10):.6f}")
        lines.append(f"\nTest set: Average loss: {0.05 / epoch:.4f}, Accuracy: {9800 + epoch * 50}/10000 (98%)\n")
    return lines


def test_pytorch_examples_sample_counter_becomes_batches_and_evaluations_land_on_real_steps(tmp_path: Path) -> None:
    src = read_text_log(_write(tmp_path, "mnist.log", _mnist(64)))
    events = list(src.events)
    steps = [e["step"] for e in events if e["kind"] == "step"]
    evals = [e for e in events if e["kind"] == "eval"]
    # batches, not samples: batch_idx 0 is step 1; epoch 1's last logged batch (930) is step 931, and epoch 2
    # counts on from its 938 batches
    assert steps[:3] == [1, 11, 21] and max(steps) == 938 + 931
    assert [s for s in steps if s > 931][0] == 939
    assert [e["step"] for e in evals] == [931, 938 + 931]
    assert evals[0]["data"]["accuracy"] == pytest.approx(0.985)
    # without the batch size printed: the unit is the counter's increment (one log interval), evenly spaced
    src = read_text_log(_write(tmp_path, "mnist2.log", _mnist(None)))
    steps = [e["step"] for e in src.events if e["kind"] == "step"]
    assert steps[:3] == [1, 2, 3] and steps == sorted(set(steps)) and max(steps) < 200


def test_a_config_dump_is_settings_not_evaluations_or_metrics(tmp_path: Path) -> None:
    dump = ["Running with full config:", "TEST:", "  EVAL_PERIOD: 200", "  DETECTIONS_PER_IMAGE: 100",
            "SOLVER:", "  MAX_ITER: 100", "  CHECKPOINT_PERIOD: 5000"]
    lines = [f"[01/02 03:04:05 d2.utils.events]:  eta: 0:00:10  iter: {i}  total_loss: {_loss(i):.4g}  "
             f"loss_cls: {_loss(i) / 2:.4g}  loss_box_reg: {_loss(i) / 2:.4g}  lr: 0.01  max_mem: 100M"
             for i in range(19, 100, 20)]
    lines.append("[01/02 03:04:06 d2.engine.hooks]: Overall training speed: 98 iterations in 0:00:20 (0.2 s / it)")
    d = _diagnose(tmp_path, dump + lines, "log.txt")
    assert d.evals == 0 and d.state == "completed" and _severe(d) == []


def test_a_metrics_name_comes_from_the_logs_own_key(tmp_path: Path) -> None:
    lines = [f"step {s}: loss={_loss(s):.4f}" for s in range(1, 30)]
    lines += ["Accuracy on validation set: 10.3 %", "[eval] A car travels at 62 km/h for 2 hours, then 3 more"]
    events = list(read_text_log(_write(tmp_path, "names.log", lines)).events)
    evals = [e["data"] for e in events if e["kind"] == "eval"]
    assert evals == [{"accuracy": 10.3}]


def test_an_evaluation_at_its_ceiling_is_not_frozen_and_a_rounded_repeat_needs_five(tmp_path: Path) -> None:
    lines = []
    for e in range(1, 9):
        lines += [f"Epoch {e}/8 - Batch {b} loss: {_loss(e * 10 + b):.4f}" for b in range(10)]
        lines.append(f"Epoch {e}: Validation Accuracy: {100.0 if e > 2 else 90 + e:.1f}%")
    assert "eval-metrics-frozen" not in _severe(_diagnose(tmp_path, lines, "ceiling.log"))
    lines = []
    for e in range(1, 9):
        lines += [f"Epoch {e}/8 - Batch {b} loss: {_loss(e * 10 + b):.4f}" for b in range(10)]
        lines.append(f"Validation accuracy: {(0.540, 0.551, 0.551, 0.551, 0.527, 0.546, 0.555, 0.551)[e - 1]:.3f}")
    assert "eval-metrics-frozen" not in _severe(_diagnose(tmp_path, lines, "rounded.log"))


def test_an_earlier_launchs_completion_is_not_the_ending_of_a_relaunch_appended_after_it(tmp_path: Path) -> None:
    first = [f"step {s} | loss {_loss(s):.4f} | lr 1.0e-04" for s in range(1, 301)] + ["Training complete"]
    again = [f"step {s} | loss {_loss(s):.4f} | lr 1.0e-04" for s in range(0, 200)]
    d = _diagnose(tmp_path, first + ["Namespace(max_steps=300)"] + again)
    assert d.state == "unfinished"
    d = _diagnose(tmp_path, first + again + [f"step {s} | loss 0.4 | lr 1.0e-04" for s in range(200, 400)]
                  + ["Training complete"], "done.log")
    assert d.state == "completed"


# -- line shapes and launches (issue 30): each from its writer's format string -------------------------


PREFIXES = ["", "2026-01-02 03:04:05,678 - INFO - ", "\x1b[36m"]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_two_line_record_takes_its_step_from_the_line_before(tmp_path: Path, prefix: str) -> None:
    # n2nmn's `print('iter = %d\n\tloss = %f, accuracy (cur) = %f, ...')`; Speaker_Verification's
    # `print("current step: %dth step" % i)` then `print("batch loss:%.10f" % loss)`
    n2nmn = [line for s in range(100, 2001, 100)
             for line in (f"{prefix}iter = {s}", f"\tloss = {_loss(s // 100):.6f}, accuracy (cur) = 0.828125, "
                                                  "entropy = 0.001946")]
    curve = _curve(_write(tmp_path, "n2nmn.log", n2nmn))
    assert [s for s, _ in curve] == list(range(100, 2001, 100))
    tisv = [line for s in range(1, 41) for line in (f"{prefix}current step: {s}th step", f"batch loss:{_loss(s):.10f}")]
    curve = _curve(_write(tmp_path, "tisv.log", tisv))
    assert [s for s, _ in curve] == list(range(1, 41)) and curve[0][1] == _loss(1)
    # cut after a step line: the record that never came is no step
    assert [s for s, _ in _curve(_write(tmp_path, "cut.log", tisv[:-1]))][-1] == 39


def test_llmc_log_file_keys_and_its_lr_print_resolution(tmp_path: Path) -> None:
    # llm.c's Logger: `s:%d trl:%.4f` per step, `s:%d tel:%.4f` per evaluation (derived trainers add lr and norm)
    total = 400
    lines = []
    for s in range(total + 1):
        if s % 50 == 0 or s == total:
            lines.append(f"s:{s} tel:{_loss(s) + 0.1:.4f}")
        if s < total:
            lr = 6e-4 * (1 - s / total)
            lines.append(f"s:{s} trl:{_loss(s):.4f} lr:{lr:.6f} norm:0.25")
    events = list(read_text_log(_write(tmp_path, "main.log", lines)).events)
    steps = [e for e in events if e["kind"] == "step"]
    evals = [e for e in events if e["kind"] == "eval"]
    # (step 0 is the state before any update: a step row counts from 1, as for every printed format)
    assert len(steps) == total - 1 and steps[-1]["step"] == total - 1 and len(evals) == total // 50 + 1
    assert evals[0]["data"] == {"loss": _loss(0) + 0.1}
    # 6e-4 * 1/400 = 1.5e-6 prints 0.000002; nothing prints 0.000000 above 5e-7
    assert all(e.get("extra", {}).get("lr_resolution") is None for e in steps if e["lr"])
    zero = ["s:1 trl:3.0 lr:0.000000 norm:0.2"]
    row = next(e for e in read_text_log(_write(tmp_path, "zero.log", zero)).events if e["kind"] == "step")
    assert row["lr"] == 0 and row["extra"]["lr_resolution"] == pytest.approx(1e-6)


def test_a_glog_prefixed_traceback_is_a_warning_not_a_crash(tmp_path: Path) -> None:
    # torch._dynamo logs a recompile failure through `logging` with glog's prefix on every line of it
    glog = "W0530 14:48:26.433000 2622492 site-packages/torch/_dynamo/convert_frame.py:1233] "
    warn = [glog + "Traceback (most recent call last):", glog + '  File "x.py", line 3, in f',
            glog + "    return g()", glog + "torch._dynamo.exc.Unsupported: call_function"]
    lines = warn + [f"step:{s}/500 train_loss:{_loss(s):.6e} train_time:{s * 10}ms" for s in range(1, 201)]
    d = _diagnose(tmp_path, lines)
    assert "run-crashed" not in _severe(d) and d.state == "unfinished"
    f = [f for f in d.findings if f.name == "log-ends-unfinished"]
    assert f and f[0].severity == "warning" and "of 500" in f[0].summary
    # an E-level line is not excused: a real traceback after the steps is still a crash
    crash = lines + ["Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
                     "RuntimeError: CUDA error: an illegal memory access was encountered"]
    assert _diagnose(tmp_path, crash, "crash.log").state == "crashed"


def test_a_shell_prompt_starts_a_launch_and_one_that_never_trains_does_not_end_the_log(tmp_path: Path) -> None:
    train = [f"epoch: {e}, batch_id: {b}, loss: {_loss(e * 10 + b):.4f}" for e in range(20) for b in range(0, 10, 3)]
    train += [f"epoch: {e} done, AUC: 0.9{e:02d}" for e in (19,)] + ["Namespace(epochs=20)"]
    infer = ["aistudio@jupyter-52221:~/work/models$ python -u ../../tools/infer.py -m config.yaml",
             *[f"epoch: {e} done, AUC: 0.94{e}" for e in range(15, 19)]]
    d = _diagnose(tmp_path, ["Namespace(epochs=20)"] + train + infer)
    assert d.state == "completed" and _severe(d) == []
    # a relaunch after the prompt that trains and stops short is judged on its own
    again = ["me@box:~$ python train.py --epochs 20", "Namespace(epochs=20)"]
    again += [f"epoch: {e}, batch_id: {b}, loss: {_loss(b):.4f}" for e in range(3) for b in range(0, 10, 3)]
    d = _diagnose(tmp_path, ["Namespace(epochs=20)"] + train + again, "again.log")
    assert d.state == "unfinished"


def test_closing_lines_and_stray_lines_after_the_end(tmp_path: Path) -> None:
    steps = [f"Epoch {e} step {e * 10 + s} loss: {_loss(e * 10 + s):.4f}" for e in range(1, 8) for s in range(1, 5)]
    # E2DTC's early-stopping summary, after a separator
    d = _diagnose(tmp_path, steps + ["=" * 17, "Best Epoch 6\tAcc: 0.8913\tnmi: 0.8267\tari: 0.7776"], "best.log")
    assert d.state == "completed" and _severe(d) == []
    # a periodic snapshot line mid-run is undone by the steps after it
    mid = steps[:10] + ["snapshot saved to ./exp/tfmodel/00010000"] + steps[10:]
    assert _diagnose(tmp_path, mid, "mid.log").state == "unfinished"
    assert _diagnose(tmp_path, steps + ["snapshot saved to ./exp/tfmodel/00080000"], "snap.log").state == "completed"
    # `Done` and then stray numbers a shell or a notebook appended
    d = _diagnose(tmp_path, steps + ["Hours: 16", "Done", "0", "10", "20", "50"], "done.log")
    assert d.state == "completed" and _severe(d) == []


def test_theano_tutorials_optimization_complete_and_trailing_punctuation(tmp_path: Path) -> None:
    lines = [f"Training Epoch: {e}, Loss: {_loss(e):.4f}." for e in range(1, 11)]
    assert [v for _, v in _curve(_write(tmp_path, "dot.log", lines))] == [_loss(e) for e in range(1, 11)]
    theano = [f"epoch {e}, minibatch 120/120, validation error {10 - e / 10:f} %" for e in range(1, 30)]
    theano.append("Optimization complete with best validation score of 7.100000 %, on iteration 3480, with "
                  "test performance 7.300000 %")
    assert _diagnose(tmp_path, theano, "sda.out").state == "completed"


def test_a_plan_printed_and_no_step_after_it_never_trained(tmp_path: Path) -> None:
    # mmengine's config dump, then the run stops before its first iteration
    dump = ["06/03 08:27:05 - mmengine - INFO - Config:", "max_epochs = 300",
            "train_cfg = dict(max_epochs=300, type='EpochBasedTrainLoop', val_interval=10)",
            "06/03 08:27:09 - mmengine - INFO - Checkpoints will be saved to /work_dirs/rtmdet."]
    d = _diagnose(tmp_path, dump)
    f = [f for f in d.findings if f.name == "log-ends-unfinished"]
    assert f and f[0].severity == "warning" and "no training step of its 300 planned epochs" in f[0].summary
    # the argparse Namespace's singular `max_epoch` is a plan too
    lines = ["Namespace(batch_size=16, max_epoch=200, lr=0.001)"]
    lines += [f"Epoch {e} - Train Loss: {_loss(e):.4f}, Val Loss: {_loss(e) + 0.1:.4f}" for e in range(1, 6)]
    f = [f for f in _diagnose(tmp_path, lines, "ns.log").findings if f.name == "log-ends-unfinished"]
    assert f and "epoch 5 of 200" in f[0].summary


def test_lightning_bar_prints_nan_as_nan_dot_zero(tmp_path: Path) -> None:
    lines = [f"Epoch 0: {p:3d}%|#| {s}/100 [00:10<00:00, 9.5it/s, v_num=hl9v, loss={v}]"
             for s, p, v in ((i, i, f"{_loss(i):.3f}" if i < 50 else "nan.0") for i in range(1, 101))]
    raw = "\r".join(lines).encode() + b"\n"
    assert "nonfinite-loss" in _severe(diagnose_source(read_text_log(_write(tmp_path, "bar.log", [], raw=raw))))


def _timm_launch(epochs: int, last_epoch: int, *, interrupted: bool) -> list[str]:
    # timm train.py: 'Scheduled epochs: N' at start-up; '*** Best metric' after the loop, Ctrl-C included
    out = ["AMP not enabled. Training in float32.", f"Scheduled epochs: {epochs}"]
    for e in range(last_epoch + 1):
        out += [f"Train: {e} [{b:4d}/390 ({100 * b // 390:3d}%)]  Loss: {_loss(e * 4 + b // 100):#.3g} (2.50)  "
                "Time: 0.250s,  1024.00/s  (0.260s,  990.00/s)  LR: 1.000e-03  Data: 0.010 (0.012)"
                for b in (0, 100, 200, 389)]
        if not (interrupted and e == last_epoch):
            out.append(f"Test: [  78/78]  Time: 0.101 (0.120)  Loss:  1.200 ( 1.200)  Acc@1: {60 + e:7.3f} "
                       f"({60 + e:7.3f})  Acc@5: 85.000 (85.000)")
    return out + [f"*** Best metric: {60 + last_epoch - 1} (epoch {last_epoch - 1})"]


def test_timm_launches_appended_and_its_best_metric_after_an_interrupt(tmp_path: Path) -> None:
    done = _timm_launch(3, 2, interrupted=False)
    assert _diagnose(tmp_path, done, "done.log").state == "completed"
    # Ctrl-C in epoch 2 of 300: the summary is printed all the same, the plan says it stopped short
    short = _diagnose(tmp_path, _timm_launch(300, 2, interrupted=True), "short.log")
    f = [f for f in short.findings if f.name == "log-ends-unfinished"]
    assert f and f[0].severity == "warning" and "of 300" in f[0].summary
    # launches appended: a finished one, then one interrupted, then start-ups that never trained; the last
    # launch that trained is the verdict
    again = done + _timm_launch(300, 2, interrupted=True) + ["Scheduled epochs: 300"] * 3
    assert _diagnose(tmp_path, again, "again.log").state == "unfinished"


def test_a_repeated_key_keeps_the_total_and_names_the_others(tmp_path: Path) -> None:
    # `Loss: X, Acc: A, Semantic loss: S, IC loss: I`: the total is the first `loss`, not the last one
    lines = [f"Epoch: [{e}/50] Iter:[{i}/100], Time: 0.5, Loss: {_loss(e * 10 + i // 10):.6f}, Acc:0.7, "
             f"Semantic loss: 0.4, IC loss: 0.1" for e in range(3) for i in range(0, 100, 10)]
    curve = _curve(_write(tmp_path, "seg.log", lines))
    assert [v for _, v in curve] == [_loss(e * 10 + i // 10) for e in range(3) for i in range(0, 100, 10)][1:]


def test_a_summary_tables_iter_row_is_no_two_line_record(tmp_path: Path) -> None:
    # W&B's closing run summary prints `wandb:   iter 3000` then `wandb:   lr 0.0001`: no step record
    lines = [f"iter {s}: loss {_loss(s):.4f}, time 10.0ms" for s in range(1, 51)]
    lines += ["wandb: Run summary:", "wandb:            iter 3000", "wandb:              lr 0.0001"]
    lines += [f"iter {s}: loss {_loss(s):.4f}, time 10.0ms" for s in range(51, 61)]
    assert [s for s, _ in _curve(_write(tmp_path, "wandb.log", lines))] == list(range(1, 61))
    # a step line whose record never follows at once: the record after other lines is not its record
    lines = ["iter = 100", "saving snapshot", "loss = 0.5, accuracy = 0.8"]
    assert _curve(_write(tmp_path, "gap.log", lines)) == []
