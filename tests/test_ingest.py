"""`trainguard diagnose PATH` on logs nobody watched: each reader, the log-only findings, and bad input.

Logs come from real processes where that is cheap (a real crash, PyTorch's own warning, TensorBoard
files written by torch's SummaryWriter, a zoo scenario's output.log); the adapters' tests
(test_integrations.py) diagnose what Hugging Face and Lightning themselves wrote. Readers are fuzzed
with hypothesis: whatever the bytes, one line and exit 2, or a diagnosis, never a traceback.

Run: pytest tests/test_ingest.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tgtest import run_trainguard

from trainguard.errors import UserError
from trainguard.ingest.diagnose import diagnose_path


def names(d) -> list[str]:
    return [f.name for f in d.findings]


def run_py(tmp: Path, code: str) -> Path:
    """Runs `code` in a real interpreter; its stdout and stderr together become train.log."""
    log = tmp / "train.log"
    with open(log, "w") as out:
        subprocess.run([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT, timeout=120, cwd=tmp)
    return log


def test_real_traceback_gives_run_crashed_with_where(tmp_path: Path) -> None:
    log = run_py(tmp_path, "import sys\nfor s in range(1, 6): print(f'step {s} loss={2.0 / s:.3f} lr=0.001', flush=True)\n"
                           "def evaluate(step):\n    return step % 500\nevaluate(None)\n")
    d = diagnose_path(log)
    crash = next(f for f in d.findings if f.name == "run-crashed")
    assert d.state == "crashed" and d.steps == 5
    assert crash.exception == "TypeError" and crash.cause == "none-operand" and crash.step == 5
    assert crash.where and crash.where.endswith("(evaluate)")


def test_traceback_with_stdout_interleaved(tmp_path: Path) -> None:
    # the watchdog's tee merges stdout and stderr: a line of output can land inside a traceback
    log = tmp_path / "output.log"
    log.write_text('step 1 loss=1.0\nTraceback (most recent call last):\nstep 2 loss=0.9\n'
                   '  File "train.py", line 5, in <module>\n    x = step % 5\n'
                   "TypeError: unsupported operand type(s) for %: 'NoneType' and 'int'\n")
    crash = next(f for f in diagnose_path(log).findings if f.name == "run-crashed")
    assert crash.cause == "none-operand" and crash.where == "train.py:5 (<module>)"


def test_pytorch_scheduler_warning_found(tmp_path: Path) -> None:
    log = run_py(tmp_path, "import torch\nm = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                           "s = torch.optim.lr_scheduler.StepLR(opt, 1)\n"
                           "for i in range(1, 4):\n    s.step(); opt.step(); print(f'step {i} loss=1.0 lr=0.1')\n"
                           "print('Training complete')\n")
    d = diagnose_path(log)
    assert "scheduler-before-optimizer" in names(d) and d.state == "completed"


def test_log_without_an_end_is_judged_by_its_data_not_its_age(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("".join(f"step {i} loss={1 / i:.3f} lr=0.001\n" for i in range(1, 50)))
    verdicts = []
    for age in (3 * 3600, 0):  # the same bytes, written 3 h ago and just now: one verdict
        os.utime(log, (time.time() - age, time.time() - age))
        f = next(f for f in diagnose_path(log).findings if f.name == "log-ends-unfinished")
        verdicts.append((f.severity, f.summary, f.evidence))
    assert verdicts[0] == verdicts[1] and verdicts[0][0] == "warning" and "ago" not in verdicts[0][1]
    # only when asked whether the run is still alive does the file's age count
    old = time.time() - 3 * 3600
    os.utime(log, (old, old))
    f = next(f for f in diagnose_path(log, alive=True).findings if f.name == "log-ends-unfinished")
    assert f.severity == "warning" and f.step == 49 and "3.0 h ago" in f.summary
    assert 3 * 3600 - 5 < f.evidence["seconds_since_last_write"] < 3 * 3600 + 600
    os.utime(log, None)  # written just now: the run may still be going
    assert next(f for f in diagnose_path(log, alive=True).findings
                if f.name == "log-ends-unfinished").severity == "info"


def test_a_scripts_own_last_word_done_is_its_end_only_as_the_last_line(tmp_path: Path) -> None:
    # the new user's torchrun script: a loss every 10 steps, then `print("done")` on rank 0
    log = tmp_path / "train.log"
    steps = "".join(f"step {i} loss {2.5 - i / 20:.4f}\n" for i in range(0, 40, 10))
    log.write_text(steps + "done\n")
    d = diagnose_path(log)
    assert d.state == "completed" and "log-ends-unfinished" not in names(d), [f.summary for f in d.findings]
    # "done" closing the data preparation, then steps and nothing: the log stops among its steps
    log.write_text("preparing data...\ndone\n" + steps)
    (f,) = [f for f in diagnose_path(log).findings if f.name == "log-ends-unfinished"]
    assert f.summary == f'{log.name} ends at step 30 among its steps, without a completion line (its last line: ' \
                        '"step 30 loss 1.0000")', f.summary


def test_log_ending_after_an_evaluation_or_at_its_last_epoch(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    body = "".join(f"Epoch {e} - Batch loss: {3 / (e + b / 10):.4f}\n" for e in range(1, 6) for b in range(20))
    log.write_text(body + "Epoch 5 - Validation BLEU: BLEU-1 70.12, BLEU-2 61.50\n")
    d = diagnose_path(log)
    assert d.steps == 100 and d.evals == 1
    assert [(f.name, f.severity, f.cause) for f in d.findings] == [("log-ends-unfinished", "info", "boundary")]
    log.write_text(body)  # cut among its steps
    assert [(f.severity, f.cause) for f in diagnose_path(log).findings] == [("warning", "among-steps")]
    log.write_text("".join(f"Epoch {e}/20 - Train Loss: {2 / e:.4f}, Val Loss: {2.2 / e:.4f}\n" for e in range(1, 21)))
    d = diagnose_path(log)
    assert (d.state, d.steps, d.evals, d.findings) == ("completed", 20, 20, [])


def test_tqdm_bar_and_hf_dict_lines(tmp_path: Path) -> None:
    pytest.importorskip("tqdm")
    log = run_py(tmp_path, "from tqdm import tqdm\nimport sys\nbar = tqdm(range(60), file=sys.stdout, mininterval=0)\n"
                           "for i in bar:\n    bar.set_postfix(loss=f'{3.0 / (i + 1):.3f}', lr=f'{0.001 if i < 10 else 0.0}')\n"
                           "print({'eval_loss': 1.5, 'epoch': 1.0})\n")
    d = diagnose_path(log)
    assert d.steps >= 50 and d.evals == 1
    assert "lr-reaches-zero" in names(d)


def test_tensorboard_files_from_summary_writer(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tmp_path / "tb"))
    for step in range(1, 41):
        w.add_scalar("train/loss", 2.0 / step if step != 25 else float("nan"), step)
        w.add_scalar("lr", 1e-3, step)
        if step % 20 == 0:
            w.add_scalar("val/loss", 1.0 / step, step)
    w.close()
    d = diagnose_path(tmp_path / "tb")
    assert d.format == "tensorboard event files" and d.steps == 40 and d.evals == 2
    assert "nonfinite-loss" in names(d)


def test_csv_jsonl_and_ultralytics_results(tmp_path: Path) -> None:
    # a 30-epoch results.csv (the real library's own files are read in tests/test_ultralytics.py):
    res = tmp_path / "results.csv"
    res.write_text("epoch,train/box_loss,train/cls_loss,train/dfl_loss,metrics/mAP50(B),val/box_loss,lr/pg0,lr/pg1,lr/pg2\n"
                   + "".join(f"{e},{1.5 - e * .01},{2.0 - e * .02},{1.1},{0.1 * e},{1.4},0.01,0.01,0.01\n"
                             for e in range(1, 31)))
    d = diagnose_path(res)
    assert d.format == "ultralytics results.csv" and d.steps == 30 and d.evals == 30
    jl = tmp_path / "m.jsonl"
    jl.write_text("".join(json.dumps({"step": s, "loss": 1 / s, "lr": 0.0 if s > 5 else 0.1}) + "\n"
                          for s in range(1, 60)) + '{"step": 60, "loss": ')  # truncated last line
    d = diagnose_path(jl)
    assert d.steps == 59 and d.skipped == 1
    assert "lr-reaches-zero" in names(d)
    assert "lr" not in {n for _, n in d.not_run}
    gen = tmp_path / "g.csv"
    gen.write_text("step,loss\n" + "".join(f"{s},{1 / s}\n" for s in range(1, 30)))
    d = diagnose_path(gen)
    assert d.steps == 29
    assert ("lr-reaches-zero", "lr") in d.not_run  # said, not silently skipped


@pytest.mark.parametrize("name", ["seed001_eval_typeerror_noprobe", "healthy_uninstrumented",
                                  "seed003_dataloader_worker_stuck_noprobe"])
def test_zoo_logs_diagnosed_as_the_live_run_was(tmp_path: Path, name: str) -> None:
    """A zoo scenario run without `trainguard.watch`: `diagnose` of its output.log alone (what a user has
    from a run trainguard never watched) agrees with what the live run found. The run folder itself now
    also holds the automatic probe's steps, so the log is named, not the folder."""
    import zoo

    result = zoo.run_scenario(name, keep=str(tmp_path))
    assert result.ok, result.problems
    live = {f["name"]: f for f in result.status["findings"]}
    # a bare log cannot show a clean exit, so the healthy twin is read with its folder's status.json
    target = tmp_path / name / "run" / ("" if name == "healthy_uninstrumented" else "output.log")
    proc = run_trainguard("diagnose", "--json", str(target))
    d = json.loads(proc.stdout.strip().splitlines()[-1])
    # a run folder the automatic probe recorded steps into is diagnosed as a trainguard run: a list of findings
    offline = {f["name"]: f for f in (d if isinstance(d, list) else d["findings"])}
    if "run-crashed" in live:
        crash, mine = live["run-crashed"], offline["run-crashed"]
        assert (mine["exception"], mine["cause"], mine["where"], mine["step"]) == \
            (crash["exception"], crash["cause"], crash["where"], crash["step"])
    elif "run-hung" in live:  # a log cannot tell a hang from a kill: it shows where it stopped
        import re

        printed = re.findall(r"^step (\d+)", (tmp_path / name / "run" / "output.log").read_text(), re.MULTILINE)
        assert d["state"] == "unfinished" and offline["log-ends-unfinished"]["step"] == int(printed[-1])
    else:  # the healthy twin prints every 50th of 300 steps
        assert result.status["state"] == "completed"
        assert [f for f in offline.values() if f["severity"] != "info"] == []
        if isinstance(d, dict):  # read from its output alone: the six printed steps, completed
            assert d["state"] == "completed" and d["steps"] == 6


# -- bad input ------------------------------------------------------------------------------------------

BAD = {
    "garbage.log": os.urandom(4096),
    "empty.log": b"",
    "trainer_state.json": b'{"log_history": [{"loss": 1.0, "step": 1}, {"lo',
    "metrics.csv": b"\x00\x01\x02" * 100,
    "nohdr.csv": b"1,2,3\n4,5,6\n",
    "prose.txt": b"Dear diary, today nothing happened.\nThe end is not near.\n",
    "huge.log": b"x" * (3 << 20),
    "x.jsonl": b"[1, 2]\n\"a\"\n",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(BAD[name])
    proc = run_trainguard("diagnose", str(path))
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("trainguard: error:") and "Traceback" not in proc.stderr


def test_unknown_folder_and_missing_path(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"\x00" * 10)
    for target in (tmp_path, tmp_path / "nope"):
        proc = run_trainguard("diagnose", str(target))
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1


def test_enormous_line_and_mixed_encodings_still_read(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    with open(log, "wb") as f:
        f.write("step 1 loss=2.0 lr=0.001 café\n".encode())
        f.write(b"y" * (5 << 20) + b"\n")  # one 5 MB line, skipped past
        f.write("step 2 loss=1.9 lr=0.001 caf\xe9\n".encode("latin-1"))
        f.write(b"step 3 loss=1.8 lr=0.001\r\nTraining complete\n")
    d = diagnose_path(log)
    assert d.steps == 3 and d.state == "completed" and d.skipped == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=3000),
       name=st.sampled_from(["fuzz.log", "fuzz.csv", "results.csv", "fuzz.jsonl", "fuzz.json", "trainer_state.json",
                             "events.out.tfevents.1.host"]))
def test_fuzz_readers_never_raise_anything_but_user_error(tmp_path: Path, data: bytes, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    try:
        diagnose_path(path)
    except UserError:
        pass


ROOT = Path(__file__).resolve().parent.parent
SEEDS = {
    "train.log": (ROOT / "scenarios" / "diagnose_seed002_progress_log" / "train.log").read_bytes()[:6000],
    "trainer_state.json": json.dumps({"max_steps": 40, "log_history": [
        {"step": s, "loss": 1 / s, "learning_rate": 1e-3, "grad_norm": 1.0} for s in range(1, 30)]}).encode(),
    "metrics.csv": b"epoch,step,train_loss,val_loss,lr-AdamW\n" + b"".join(b"0,%d,%f,,0.001\n" % (s, 1 / s)
                                                                          for s in range(1, 40)),
    "m.jsonl": b"".join(b'{"step": %d, "loss": %f}\n' % (s, 1 / s) for s in range(1, 40)),
}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(SEEDS)), data=st.data())
def test_fuzz_mutated_real_formats(tmp_path: Path, name: str, data: st.DataObject) -> None:
    """Valid files with bytes flipped, inserted, deleted, or cut off: read, or refused in one line."""
    raw = bytearray(SEEDS[name])
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(raw)))
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if op == "flip" and pos < len(raw):
            raw[pos] = data.draw(st.integers(0, 255))
        elif op == "insert":
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=40))
        elif op == "delete":
            del raw[pos:pos + data.draw(st.integers(1, 200))]
        else:
            del raw[pos:]
    path = tmp_path / name
    path.write_bytes(bytes(raw))
    try:
        diagnose_path(path)
    except UserError:
        pass


LINES = st.sampled_from([
    "step 3 loss=nan lr=0", "{'loss': 'inf', 'learning_rate': '1e-3'}", " 50%|##| 5/10 [00:01<00:01, loss=1e400]",
    "Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "ValueError: boom",
    "[Eval] loss: -0", "Step 99999999999999999999: loss=1", "step 2 loss=1.0.0 lr=--1", "Training complete",
    "Epoch 1:  10%|#| 1/10 [00:00, loss=2.0, v_num=0]", "{'eval_loss': nan, 'step': -5}", "step 1 lr=1e-3",
])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.one_of(LINES, st.text(max_size=80)), max_size=40))
def test_fuzz_text_lines(tmp_path: Path, lines: list[str]) -> None:
    path = tmp_path / "fuzz.log"
    path.write_bytes("\n".join(lines).encode("utf-8", "replace"))
    try:
        d = diagnose_path(path)
    except UserError:
        return
    assert d.state in ("completed", "crashed", "unfinished")


# -- formats seen in public repositories, reproduced (never copied) ------------------------------------

def test_llama_factory_trainer_log_jsonl(tmp_path: Path) -> None:
    """LLaMA-Factory's trainer_log.jsonl: `current_steps` of `total_steps`, timings as strings."""
    def rows(upto: int) -> str:
        return "".join(json.dumps({"current_steps": s, "total_steps": 400, "loss": round(3 / (1 + s / 50), 4),
                                   "reward": None, "learning_rate": 5e-5 * (1 - s / 400), "epoch": s / 200,
                                   "percentage": s / 4, "elapsed_time": "0:01:02", "remaining_time": "0:10:00"})
                       + "\n" for s in range(10, upto + 1, 10))
    log = tmp_path / "trainer_log.jsonl"
    log.write_text(rows(400))
    d = diagnose_path(log)
    assert (d.format, d.steps, d.state, d.findings) == ("llama-factory trainer_log.jsonl", 40, "completed", [])
    log.write_text(rows(200))  # stopped half way
    d = diagnose_path(log)
    assert d.state == "unfinished" and [(f.name, f.severity) for f in d.findings] == [("log-ends-unfinished", "warning")]


def test_step_loss_tsv_saved_as_a_log(tmp_path: Path) -> None:
    for name in ("train.log", "losses.tsv"):
        log = tmp_path / name
        log.write_text("step\tloss\n" + "".join(f"{s}\t{8 / (1 + s / 100):.6f}\n" for s in range(10, 2010, 10)))
        d = diagnose_path(log)
        assert d.format == "tab-separated table" and d.steps == 200 and d.findings == []


def test_pytorch_examples_table_lines_read_nan(tmp_path: Path) -> None:
    """word_language_model's `| epoch 1 | 200/ 2983 batches | lr 20.00 | ms/batch 7.5 | loss nan | ppl nan`."""
    lines = []
    for e in range(1, 4):
        lines += [f"| epoch {e:3d} | {b:5d}/ 1000 batches | lr 20.00 | ms/batch  7.50 | loss   nan | ppl      nan"
                  for b in range(200, 1001, 200)]
        lines.append(f"| end of epoch {e:3d} | time: 23.00s | valid loss   nan | valid ppl      nan")
    lines.append("| End of training | test loss   nan | test ppl      nan")
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    d = diagnose_path(log)
    assert d.steps == 15 and d.state == "completed" and d.evals == 4
    first = next(f for f in d.findings if f.name == "nonfinite-loss")
    assert first.step == 200
    assert "eval-metrics-frozen" not in names(d)  # NaN is nonfinite-loss's finding, not a frozen result


def test_tqdm_glued_eval_and_val_loss_lines(tmp_path: Path) -> None:
    bar = "\r".join(f"Training: {i}%|#| {i}/100 [00:0{i % 10}<00:10, 9.0it/s, loss={5 / i:.3f}]" for i in range(1, 101))
    log = tmp_path / "output.log"
    log.write_text(bar.replace("50/100 [00:00<00:10, 9.0it/s, loss=0.100]",
                               "50/100 [00:00<00:10, 9.0it/s, loss=0.100][Eval] step 50 loss: 2.25")
                   + "\nstep 100 val_loss=1.9 val_acc=0.61\nTraining complete\n")
    d = diagnose_path(log)
    assert d.steps == 100 and d.evals == 2 and d.state == "completed"


def test_launch_failure_is_a_crash_not_unreadable(tmp_path: Path) -> None:
    log = run_py(tmp_path, "import argparse\np = argparse.ArgumentParser(prog='train_bash.py')\n"
                           "p.add_argument('--fp16', choices=['true', 'false'])\np.parse_args(['--fp16', 's'])\n")
    d = diagnose_path(log)
    crash = next(f for f in d.findings if f.name == "run-crashed")
    # its own state since issue 30: the run never started (a TG501 run-crashed finding says why)
    assert d.state == "launch-failed" and crash.cause == "launch-refused" and "--fp16" in crash.summary


def test_loss_part_keys_and_columns(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("".join(f"step {s} loss={0.7 * 2 / s + 0.3 * 3:.4f} loss_kd={2 / s:.4f} loss_lm=3.0\n"
                           for s in range(1, 41)) + "done: 40 steps\n")
    d = diagnose_path(log)
    assert d.state == "completed" and "parts" not in {n for _, n in d.not_run}
    assert "loss-parts-dont-sum" in names(d)  # 0.7/0.3 weights applied but never reported
    table = tmp_path / "metrics.jsonl"
    table.write_text("".join(json.dumps({"iteration": s, "total_loss": 1 / s + 0.5, "loss_cls": 1 / s,
                                         "loss_box_reg": 0.5}) + "\n" for s in range(1, 41)))
    d = diagnose_path(table)
    assert "parts" not in {n for _, n in d.not_run} and d.findings == []
