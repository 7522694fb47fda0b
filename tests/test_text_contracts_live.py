"""The printed-format contracts on a live run: `trainguard run` reads the command's output through the same
reader as `diagnose` (watchdog/liveoutput.py), so a sample counter is not taken for a step there either.

    pytest -q -p no:xdist tests/test_text_contracts_live.py
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from tgtest import run_trainguard

from trainguard.store.printed import read_printed
from trainguard.store.reader import RunReader

pytestmark = pytest.mark.process

# pytorch/examples' mnist loop, shaped as its writer prints: the bracket is batch_idx * len(data), a sample
# counter; the batch size is printed in the args Namespace first, as many copies of the script do
MNIST = """
    import argparse, time
    {imports}
    args = argparse.Namespace(batch_size=32, epochs=2, log_interval=5, lr=0.05)
    print(args, flush=True)
    n, batches = 32 * 40, 40
    {setup}
    for epoch in range(1, args.epochs + 1):
        for batch_idx in range(batches):
            {step}
            if batch_idx % args.log_interval == 0:
                print('Train Epoch: {{}} [{{}}/{{}} ({{:.0f}}%)]\\tLoss: {{:.6f}}'.format(
                    epoch, batch_idx * args.batch_size, n, 100. * batch_idx / batches, loss), flush=True)
            time.sleep(0.005)
        print('\\nTest set: Average loss: {{:.4f}}, Accuracy: {{}}/{{}} ({{:.0f}}%)\\n'.format(
            loss, 900 + epoch, 1000, 90.0), flush=True)
"""


def _run(tmp_path: Path, script: str) -> dict:
    (tmp_path / "train.py").write_text(textwrap.dedent(script))
    r = run_trainguard("run", "--quiet", "--run-dir", str(tmp_path / "run"), "--", sys.executable, "train.py",
                       cwd=tmp_path, timeout=180)
    assert r.returncode in (0, 1), r.stderr
    return json.loads((tmp_path / "run" / "status.json").read_text())


def test_a_printed_sample_counter_is_kept_as_batches_not_samples(tmp_path: Path) -> None:
    script = MNIST.format(imports="", setup="", step="loss = 2.0 / (1 + 0.05 * ((epoch - 1) * batches + batch_idx))")
    status = _run(tmp_path, script)
    assert status["state"] == "completed"
    steps = [r["step"] for r in read_printed(tmp_path / "run")]
    # batch_idx 0, 5, ... of epoch 1 are steps 1, 6, ...; epoch 2 goes on from its 40 batches, never 32x that
    assert steps[:3] == [1, 6, 11] and steps[-1] == 40 + 36
    assert [f["name"] for f in status["findings"] if f["severity"] in ("warning", "error")] == []


def test_printed_steps_and_the_automatic_probes_steps_are_one_axis(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = MNIST.format(
        imports="import torch",
        setup="model = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=args.lr); "
              "x = torch.randn(args.batch_size, 4); y = x.sum(1, keepdim=True)",
        step="opt.zero_grad(); l = ((model(x) - y) ** 2).mean(); l.backward(); opt.step(); loss = l.item()")
    status = _run(tmp_path, script)
    assert status["state"] == "completed"
    printed = [r["step"] for r in read_printed(tmp_path / "run")]
    last = RunReader(tmp_path / "run").last_step()
    probe_steps = last["step"] if last else None
    # 80 optimizer steps: the probe counts them, the printed lines say the same (not 2,528 samples)
    assert probe_steps == 80
    assert printed and printed[-1] == 76 and max(printed) <= probe_steps
