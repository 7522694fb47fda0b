"""Checkpoints verified while the run goes on (issue 37): real files on the CPU, real child processes, a
real training run. Run: PYTHONPATH=src python -m pytest -p no:xdist -q tests/test_checkpoint_verify.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from trainguard.checkpoints.judge import verdict  # noqa: E402
from trainguard.checkpoints.read import read_checkpoint  # noqa: E402
from trainguard.checkpoints.resume import resume_choice  # noqa: E402
from trainguard.checkpoints.verifier import Verifier  # noqa: E402
from trainguard.rules.engine import run_rules  # noqa: E402

pytestmark = pytest.mark.process


def _state(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).state_dict()


def _poisoned(sd: dict) -> dict:
    bad = {k: v.clone() for k, v in sd.items()}
    bad["0.weight"][1, 2] = float("nan")
    bad["0.weight"][3, 4] = float("inf")
    bad["0.weight"][5, 6] = float("nan")
    return bad


# -- the reader, on real files of each format -------------------------------------------------------------

def test_torch_file_nan_is_counted_by_tensor(tmp_path: Path) -> None:
    torch.save({"model": _poisoned(_state()), "step": 40}, tmp_path / "ck.pt")
    facts = read_checkpoint(tmp_path / "ck.pt")
    assert facts["error"] is None and facts["tensors"] == 4
    assert facts["nonfinite_tensors"] == 1 and facts["nonfinite_elements"] == 3
    assert facts["nonfinite"][0]["tensor"] == "model.0.weight" and facts["nonfinite"][0]["nan"] == 2
    assert (facts["claimed_step"], facts["claimed_from"]) == (40, "step")
    assert verdict(facts, at_step=40, previous=None)[0] == "poisoned"


def test_healthy_files_verify_and_fingerprint_tracks_content(tmp_path: Path) -> None:
    torch.save({"model": _state(0), "iter_num": 7}, tmp_path / "a.pt")
    torch.save({"model": _state(0), "iter_num": 7}, tmp_path / "b.pt")
    torch.save({"model": _state(1), "iter_num": 7}, tmp_path / "c.pt")
    a, b, c = (read_checkpoint(tmp_path / n) for n in ("a.pt", "b.pt", "c.pt"))
    assert verdict(a, at_step=7, previous=None)[0] == "verified"
    assert a["fingerprint"] == b["fingerprint"] != c["fingerprint"]


def test_truncated_file_is_unloadable(tmp_path: Path) -> None:
    torch.save({"model": _state(), "step": 10}, tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) * 2 // 3])
    facts = read_checkpoint(tmp_path / "cut.pt")
    assert facts["error"]
    assert verdict(facts, at_step=10, previous=None)[0] == "unloadable"


def test_objects_weights_only_refuses_are_unverified_not_broken(tmp_path: Path) -> None:
    import argparse

    torch.save({"model": _state(), "args": argparse.Namespace(lr=1.0)}, tmp_path / "ns.pt")
    facts = read_checkpoint(tmp_path / "ns.pt")
    assert facts["error"] is None and facts["unverifiable"]
    assert verdict(facts, at_step=1, previous=None)[0] == "unverified"


def test_safetensors_file(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file(_poisoned(_state()), str(tmp_path / "model.safetensors"), metadata={"step": "12"})
    facts = read_checkpoint(tmp_path / "model.safetensors")
    assert facts["format"] == "safetensors" and facts["nonfinite_elements"] == 3
    assert facts["claimed_step"] == 12


def test_hf_folder_with_sharded_index_and_trainer_state(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    folder = tmp_path / "checkpoint-30"
    folder.mkdir()
    sd = _state()
    names = sorted(sd)
    save_file({k: sd[k] for k in names[:2]}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({k: sd[k] for k in names[2:]}, str(folder / "model-00002-of-00002.safetensors"))
    index = {"weight_map": {k: f"model-0000{1 if i < 2 else 2}-of-00002.safetensors" for i, k in enumerate(names)}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 30}))
    (folder / "training_args.bin").write_bytes(b"not read: it pickles a class")
    facts = read_checkpoint(folder)
    assert facts["error"] is None and facts["tensors"] == 4
    assert (facts["claimed_step"], facts["claimed_from"]) == (30, "trainer_state.json global_step")
    assert verdict(facts, at_step=30, previous=None)[0] == "verified"
    # stale: the folder says 30, the run was at 90 when it reported it
    assert verdict(facts, at_step=90, previous=None)[0] == "step-mismatch"
    (folder / "model-00002-of-00002.safetensors").unlink()
    assert verdict(read_checkpoint(folder), at_step=30, previous=None)[0] == "unloadable"


def test_pytorch_model_bin_folder(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-5"
    folder.mkdir()
    torch.save(_poisoned(_state()), folder / "pytorch_model.bin")
    facts = read_checkpoint(folder)
    assert facts["claimed_step"] == 5 and facts["claimed_from"] == "the path"
    assert verdict(facts, at_step=5, previous=None)[0] == "poisoned"


def test_inf_masks_are_by_design_nan_never(tmp_path: Path) -> None:
    sd = _state()
    sd["attn.mask"] = torch.full((4, 4), float("-inf")).triu(1)
    torch.save(sd, tmp_path / "ck.pt")
    facts = read_checkpoint(tmp_path / "ck.pt")
    assert facts["nonfinite_tensors"] == 1 and verdict(facts, at_step=1, previous=None)[0] == "verified"
    sd["attn.mask"][3, 0] = float("nan")
    torch.save(sd, tmp_path / "ck.pt")
    assert verdict(read_checkpoint(tmp_path / "ck.pt"), at_step=1, previous=None)[0] == "poisoned"


def test_judge_step_and_unchanged_rules() -> None:
    facts = {"path": "/r/ck-200.pt", "tensors": 3, "elements": 10, "fingerprint": "f", "claimed_step": 100,
             "claimed_from": "step"}
    assert verdict(facts, at_step=200, previous=None)[0] == "step-mismatch"
    assert verdict(facts, at_step=101, previous=None)[0] == "verified"  # one step of slack
    assert verdict(facts, at_step=50, previous=None)[0] == "verified"  # a counter ahead is no proof
    assert verdict({**facts, "path": "/r/best.pt"}, at_step=200, previous=None)[0] == "verified"
    same = {**facts, "claimed_step": None}
    prev = {"path": "/r/ck-100.pt", "at_step": 100, "fingerprint": "f"}
    assert verdict(same, at_step=200, previous=prev)[0] == "unchanged"
    assert verdict(same, at_step=200, previous=prev, learning=False)[0] == "verified"
    assert verdict(same, at_step=100, previous=prev)[0] == "verified"  # the run did not move


# -- the verifier process and the rules ----------------------------------------------------------------------

def test_verifier_child_records_verdicts_and_costs(tmp_path: Path) -> None:
    torch.save({"model": _state(), "step": 10}, tmp_path / "ck-10.pt")
    torch.save({"model": _poisoned(_state()), "step": 20}, tmp_path / "ck-20.pt")
    got: list[dict] = []
    v = Verifier(lambda path, step, data: got.append(data))
    v.submit(tmp_path / "ck-10.pt", 10)
    v.submit(tmp_path / "ck-20.pt", 20)
    assert v.settle(120)
    v.stop()
    assert [d["status"] for d in got] == ["verified", "poisoned"]
    assert got[1]["last_verified"] == str(tmp_path / "ck-10.pt")
    assert got[0]["cpu_s"] >= 0 and got[0]["peak_rss_mb"] > 0 and got[0]["wall_s"] > 0
    events = [{"kind": "checkpoint-check", "name": d["path"], "step": d["at_step"], "t": i, "data": d}
              for i, d in enumerate(got)]
    found = run_rules(events)
    assert [f.name for f in found] == ["checkpoint-poisoned"]
    f = found[0]
    assert f.severity == "error" and str(tmp_path / "ck-10.pt") in f.fix
    assert f.evidence["nonfinite"][0]["tensor"] == "model.0.weight" and f.evidence["nonfinite_elements"] == 3


def test_a_fixed_path_rewritten_after_its_report_is_judged_by_the_later_report(tmp_path: Path) -> None:
    # ckpt.pt saved every few steps: by the time the verifier reads the first report's file, it holds a
    # later step's weights; judging those by the first report (and then calling the later one "unchanged")
    # was a false error on a healthy run (the zoo's quiet_mlp_classifier)
    path = tmp_path / "ckpt.pt"
    torch.save(_state(0), path)
    first_report = time.time()
    time.sleep(2.5)
    torch.save(_state(1), path)  # rewritten before the verifier got to the first report
    got: list[dict] = []
    v = Verifier(lambda p, step, data: got.append(data))
    v.submit(path, 50, t=first_report)
    v.submit(path, 100)
    assert v.settle(120)
    torch.save(_state(2), path)
    v.submit(path, 150)
    assert v.settle(120)
    v.stop()
    assert [(d["at_step"], d["status"]) for d in got] == [(100, "verified"), (150, "verified")]


def test_verifier_bounds_memory_and_fails_open(tmp_path: Path) -> None:
    torch.save({"model": _state(), "step": 1}, tmp_path / "ck.pt")
    got: list[dict] = []
    v = Verifier(lambda path, step, data: got.append(data), max_anon_mb=1)  # torch alone is more than that
    v.submit(tmp_path / "ck.pt", 1)
    assert v.settle(120)
    assert got[0]["status"] == "unverified" and "memory limit" in got[0]["why"]
    v2 = Verifier(lambda path, step, data: got.append(data), python=str(tmp_path / "no-such-python"))
    v2.submit(tmp_path / "ck.pt", 1)
    assert v2.settle(30)
    assert got[1]["status"] == "unverified" and "could not start" in got[1]["why"]


def test_resume_choice_takes_the_newest_verified() -> None:
    ck = [{"kind": "checkpoint", "name": p, "data": {"path": p}} for p in ("/a/1", "/a/2", "/a/3")]
    checks = [{"data": {"path": "/a/1", "status": "verified"}}, {"data": {"path": "/a/2", "status": "verified"}},
              {"data": {"path": "/a/3", "status": "poisoned"}}]
    path, note = resume_choice(ck, checks, exists=lambda p: True)
    assert path == "/a/2" and "/a/3" in note and "poisoned" in note
    path, note = resume_choice(ck, [], exists=lambda p: True)
    assert path == "/a/3" and "not verified" in note


# -- a real training run under watch() ------------------------------------------------------------------

_SCRIPT = """
import sys, torch, trainguard
run_dir, poison = sys.argv[1], sys.argv[2] == "1"
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=40, run_dir=run_dir)
for step in range(1, 41):
    x = torch.randn(16, 8)
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    guard.step(loss)
    if step % 20 == 0:
        sd = {k: v.clone() for k, v in model.state_dict().items()}
        if poison and step == 40:
            sd["weight"][0, 0] = float("nan")
        torch.save({"model": sd, "step": step}, f"{run_dir}/../ck-{step}.pt")
        guard.checkpoint_saved(f"{run_dir}/../ck-{step}.pt")
guard.finish()
"""


@pytest.mark.parametrize("poison", [True, False])
def test_training_run_under_watch_gets_the_finding(tmp_path: Path, poison: bool) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    run_dir = tmp_path / "run"
    t0 = time.time()
    out = subprocess.run([sys.executable, str(script), str(run_dir), "1" if poison else "0"], capture_output=True,
                         text=True, timeout=180)
    elapsed = time.time() - t0
    assert out.returncode == 0, out.stderr
    status = json.loads((run_dir / "status.json").read_text())
    names = [f["name"] for f in status["findings"]]
    from trainguard.store.reader import RunReader

    with RunReader(run_dir) as reader:
        checks = reader.events("checkpoint-check")
    assert [c["data"]["status"] for c in checks] == (["verified", "poisoned"] if poison else ["verified", "verified"])
    if poison:
        assert "checkpoint-poisoned" in names, out.stderr
        f = next(f for f in status["findings"] if f["name"] == "checkpoint-poisoned")
        assert f["severity"] == "error" and f["step"] == 40 and "ck-20.pt" in f["fix"]
        assert "TG561 checkpoint-poisoned" in out.stderr
        assert elapsed < 120
    else:
        assert not [n for n in names if n.startswith("checkpoint-")], names
