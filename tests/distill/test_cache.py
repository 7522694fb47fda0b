"""The offline teacher cache: built under the guard, resumable, verified, and a student trained from it
gets the targets the online teacher gives (up to the stored 0.001-nat quantisation)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from trainguard.recipes.distill.cache import TeacherCache, dequantize, quantize, targets_for
from trainguard.recipes.distill.cache_build import build_cache, verify_cache
from trainguard.store.reader import RunReader


def reader_plan(run_dir: str) -> dict:
    with RunReader(run_dir) as reader:
        return reader.meta().get("plan") or {}


@pytest.fixture(scope="module")
def built(base_dict, tmp_path_factory):
    import copy

    from trainguard.recipes.distill.config import parse_config

    d = copy.deepcopy(base_dict)
    d["data"]["window_chars"] = 160
    cfg = parse_config(d)
    folder = tmp_path_factory.mktemp("cache") / "c"
    # killed after its first shard, then resumed: the finished shard is kept, the rest written
    first = build_cache(cfg, folder, k=32, shard_windows=40, run_dir=str(folder.parent / "run1"), stop_after_shards=1,
                        verbose=False)
    again = build_cache(cfg, folder, k=32, shard_windows=40, run_dir=str(folder.parent / "run2"), verbose=False)
    return cfg, folder, first, again


def test_build_resumes_by_shard_and_the_guard_watched_it(built):
    cfg, folder, first, again = built
    assert first["written"] == 1 and not first["complete"]
    assert again["kept"] == 1 and again["written"] == again["shards"] - 1 and again["complete"]
    with RunReader(again["run_dir"]) as reader:
        status, steps = reader.status(), list(reader.steps())
        findings = reader.findings()
    assert status["state"] == "completed" and findings == []
    assert reader_plan(again["run_dir"])["learning"] is False  # the teacher is not trained: no learning rules
    assert len(steps) == again["shards"]  # one step per shard
    # the written shards' loss is the teacher's own LM cross-entropy, a real positive number
    assert all(r["loss"] > 0 for r in steps[1:])
    assert 0 < again["bytes_per_position"] < 32 * 6  # compressed below raw uint32 ids + fp16 values


def test_verify_recomputes_shards_with_the_teacher_and_catches_a_changed_file(built, tmp_path):
    cfg, folder, _, _ = built
    report = verify_cache(cfg, folder, shards=2)
    assert report["ok"] and report["ids_identical_share"] > 0.98 and report["max_abs_logp_error"] <= 1 / 1024 + 1e-3
    # a damaged copy: one shard's values shifted by 0.1 nat
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    shard = bad / "shard-00000.npz"
    with np.load(shard) as z:
        data = {k: z[k] for k in z.files}
    data["q"][:, 0] += 100
    np.savez_compressed(shard, **data)
    assert not verify_cache(cfg, bad, shards=100)["ok"]  # every shard recomputed


def test_cached_targets_equal_the_online_teacher_targets(built):
    from trainguard.recipes.distill.build import body_and_head, load_model, load_tokenizer
    from trainguard.recipes.distill.data import collate, prepare, read_text, windows
    from trainguard.recipes.distill.kd import teacher_targets
    from trainguard.recipes.distill.vocab_map import build_vocab_map

    cfg, folder, _, _ = built
    cache = TeacherCache(folder)
    text = read_text(cfg.resolve_path(cfg.data.train))
    t_tok = load_tokenizer("teacher", cfg.teacher, text, cache.manifest["teacher_tokenizer"])
    s_tok = load_tokenizer("student", cfg.student, text)
    torch.manual_seed(cfg.seed)
    teacher = load_model("teacher", cfg.teacher, t_tok).eval()
    vmap = build_vocab_map(t_tok.token_bytes, s_tok.token_bytes, cache.manifest["teacher_width"])
    ex = prepare(windows(text, cfg.data.window_chars), s_tok, t_tok)
    batch = collate([ex[3], ex[50], ex[7]], s_tok.bos_id, t_tok.bos_id)
    cached = targets_for(cache, batch["windows"], vmap.numpy(), 16, s_tok.vocab_size)
    body, head = body_and_head(teacher)
    with torch.no_grad():
        h = body(input_ids=batch["t_ids"], attention_mask=batch["t_mask"]).last_hidden_state.flatten(0, 1)[batch["t_pos"]]
    online = teacher_targets(h, head, vmap, 16, cfg.loss.kd.temperature, s_tok.vocab_size, chunk=64)
    assert cached.sid.shape == online.sid.shape == (len(batch["t_pos"]), 16)
    for r in range(online.sid.shape[0]):  # same entries (rows in any order), values within the quantum
        a = sorted(zip(online.sid[r].tolist(), online.logp[r].tolist()))
        b = sorted(zip(cached.sid[r].tolist(), cached.logp[r].tolist()))
        assert [x for x, _ in a] == [x for x, _ in b]
        assert max(abs(x - y) for (_, x), (_, y) in zip(a, b)) <= 0.6 / 1024 + 1e-5
    torch.testing.assert_close(cached.tail, online.tail, atol=2e-3, rtol=1e-3)


def test_cached_partial_targets_equal_the_online_teacher_targets(built):
    """Positions inside a teacher token (the default loss.kd.partial): the cache gives the targets the online
    teacher gives, through the same mapping: same student ids, values within half a quantisation step."""
    from trainguard.recipes.distill.build import body_and_head, load_model, load_tokenizer
    from trainguard.recipes.distill.cache import partial_logp_for
    from trainguard.recipes.distill.data import collate, prepare, read_text, windows
    from trainguard.recipes.distill.losses import partial_from_logprobs, partial_targets
    from trainguard.recipes.distill.partial import PartialMapper

    cfg, folder, _, _ = built
    assert cfg.loss.kd.partial  # the default
    cache = TeacherCache(folder)
    assert cache.format == 2 and cache.partial["rows"] > 0
    text = read_text(cfg.resolve_path(cfg.data.train))
    t_tok = load_tokenizer("teacher", cfg.teacher, text, cache.manifest["teacher_tokenizer"])
    s_tok = load_tokenizer("student", cfg.student, text)
    torch.manual_seed(cfg.seed)
    teacher = load_model("teacher", cfg.teacher, t_tok).eval()
    ex = prepare(windows(text, cfg.data.window_chars), s_tok, t_tok, partial=PartialMapper(t_tok.token_bytes,
                                                                                           s_tok.token_bytes))
    batch = collate([ex[3], ex[50], ex[7]], s_tok.bos_id, t_tok.bos_id)
    n = len(batch["s_part"])
    assert n > 10
    cached = partial_from_logprobs(partial_logp_for(cache, batch["partial_windows"], batch["part_tid"]),
                                   batch["part_tid"], batch["part_sid"], s_tok.vocab_size)
    body, head = body_and_head(teacher)
    with torch.no_grad():
        h = body(input_ids=batch["t_ids"], attention_mask=batch["t_mask"]).last_hidden_state.flatten(0, 1)[batch["t_part"]]
    online = partial_targets(h, head, batch["part_tid"], batch["part_sid"], cfg.loss.kd.temperature, s_tok.vocab_size)
    assert torch.equal(cached.sid, online.sid) and torch.equal(cached.mapped, online.mapped)
    assert cached.mapped.sum() > n  # real targets, several ids per row
    err = (cached.logp - online.logp).abs()[online.mapped & (online.logp > -60)]
    assert err.max() <= 0.5 / 1024 + 1e-5
    torch.testing.assert_close(cached.tail, online.tail, atol=2e-3, rtol=1e-3)
    # a batch laid out for another tokenisation (rows shifted by one) is refused, not misread
    with pytest.raises(Exception, match="another student tokenisation"):
        partial_logp_for(cache, batch["partial_windows"], batch["part_tid"].roll(1, 0))


def test_verify_recomputes_the_partial_rows_and_catches_a_changed_value(built, tmp_path):
    import shutil

    cfg, folder, _, _ = built
    report = verify_cache(cfg, folder, shards=1)
    assert report["ok"] and report["partial_rows"] > 0 and report["partial_ids_identical"]
    assert report["partial_max_abs_logp_error"] <= 1 / 1024 + 1e-3
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    for shard in bad.glob("shard-*.npz"):  # one partial value moved by 0.1 nat in every shard
        with np.load(shard) as z:
            data = {k: z[k] for k in z.files}
        data["p_q"][len(data["p_q"]) // 2] += 100
        np.savez_compressed(shard, **data)
    report = verify_cache(cfg, bad, shards=1)
    assert not report["ok"] and report["partial_max_abs_logp_error"] > 0.09


def test_student_trains_from_the_cache_without_the_teacher(built, make_cfg, tmp_path, monkeypatch):
    from trainguard.recipes.distill import train as train_mod

    cfg, folder, _, _ = built
    cache_cfg = make_cfg(data__window_chars=160, data__teacher_cache=str(folder), loss__hidden__start=0.0,
                         loss__hidden__end=0.0, loss__kd__top_k=16)
    assert cache_cfg.loss.kd.partial  # the default: positions inside a teacher token from the cache too
    loaded, partial_rows = [], []
    real = train_mod.load_model
    monkeypatch.setattr(train_mod, "load_model", lambda side, *a: loaded.append(side) or real(side, *a))
    real_partial = train_mod.partial_logp_for
    monkeypatch.setattr(train_mod, "partial_logp_for",
                        lambda *a: partial_rows.append(int(np.isfinite(real_partial(*a).numpy()).sum())) or real_partial(*a))
    r = train_mod.train(cache_cfg, run_dir=tmp_path / "student", verbose=False)
    assert loaded == ["student"]  # the teacher was never built
    # every training micro-batch, and every evaluation batch (the cache's eval.npz: kd_topk on held-out text)
    t = cache_cfg.train
    eval_batches = -(-cache_cfg.data.eval_windows // t.batch_size) * len(r["evals"])
    assert len(partial_rows) == t.max_steps * t.grad_accum + eval_batches and min(partial_rows) > 0
    assert all(ev["kd_topk"] > 0 for ev in r["evals"])
    assert r["step"] == cache_cfg.train.max_steps and all(np.isfinite(r["losses"]))
    with RunReader(r["run_dir"]) as reader:
        rows = list(reader.steps())
        assert reader.findings() == []
    assert all(row["parts"]["kd"] > 0 and row["weights"]["kd"] > 0 for row in rows)
    # a cache built for other windows is refused in one line
    other = make_cfg(data__window_chars=200, data__teacher_cache=str(folder), loss__hidden__start=0.0,
                     loss__hidden__end=0.0)
    with pytest.raises(Exception, match="window_chars=160"):
        train_mod.train(other, run_dir=tmp_path / "other", verbose=False)


def test_preload_holds_the_shards_before_the_loop_within_the_memory_budget(built, monkeypatch):
    from trainguard.recipes.distill import cache as cache_mod

    _, folder, _, again = built
    c = TeacherCache(folder)
    assert c.preload() == again["shards"]  # a small cache: every shard, decompressed once
    held = dict(c._shards)
    for w in range(c.n_windows):  # reading every window afterwards decompresses nothing more
        c.window(w)
    assert c._shards.keys() == held.keys() and all(c._shards[i] is held[i] for i in held)
    one = sum(a.nbytes for a in held[0].values())
    monkeypatch.setattr(cache_mod, "MEMORY", int(one * 2.5))  # room for two shards of about this size
    small = TeacherCache(folder)
    assert small.preload() == 2
    assert small.window(c.n_windows - 1)[0].shape[1] == 32  # a shard not held is still read on demand


def test_quantisation_round_trip_is_monotone_and_within_half_a_step():
    rng = np.random.default_rng(0)
    lp = -np.sort(rng.exponential(3.0, size=(50, 64)), axis=1).astype(np.float32)
    back = dequantize(quantize(lp))
    assert np.abs(back - lp).max() <= 0.5 / 1024 + 1e-6
    assert (np.diff(back, axis=1) <= 0).all()


def test_cache_cli_bad_folder_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "trainguard.recipes.distill", "cache", "info", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no manifest.json" in proc.stderr


def test_cache_cli_info_reports_the_build(built):
    _, folder, _, _ = built
    proc = subprocess.run([sys.executable, "-m", "trainguard.recipes.distill", "cache", "info", str(folder)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["complete"] and info["k"] == 32 and info["shards_done"] == info["shards"]
    assert info["format"] == 2 and info["partial"]["rows"] == info["partial_rows"] > 0  # the default: partial on
    assert 0 < info["partial_bytes_per_row"] and 0 < info["aligned_bytes_per_position"] < info["bytes_per_position"]


@pytest.fixture(scope="module")
def aligned_only(base_dict, tmp_path_factory):
    """A cache as the format-1 builder wrote it (aligned entries only): built with loss.kd.partial off, its
    manifest then marked format 1 (the shards of both are the same arrays)."""
    import copy

    from trainguard.recipes.distill.config import parse_config

    d = copy.deepcopy(base_dict)
    d["data"]["window_chars"] = 160
    d["loss"]["kd"]["partial"] = False
    folder = tmp_path_factory.mktemp("old") / "c"
    build_cache(parse_config(d), folder, k=16, shard_windows=200, run_dir=str(folder.parent / "run"),
                verbose=False)
    with np.load(folder / "shard-00000.npz") as z:
        assert not any(name.startswith("p_") for name in z.files)
    m = json.loads((folder / "manifest.json").read_text())
    assert m["partial"] is None
    m["format"] = 1
    del m["partial"]
    (folder / "manifest.json").write_text(json.dumps(m))
    return folder


def test_an_aligned_only_cache_with_partial_on_is_refused_in_one_line_exit_2(aligned_only, base_dict, tmp_path):
    import copy

    import yaml

    d = copy.deepcopy(base_dict)
    d["data"].update(window_chars=160, teacher_cache=str(aligned_only))
    d["loss"]["hidden"].update(start=0.0, end=0.0)
    d["loss"]["kd"]["top_k"] = 16
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(d))
    proc = subprocess.run([sys.executable, "-m", "trainguard.recipes.distill", str(path), "--run-dir",
                           str(tmp_path / "run")], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and "aligned positions only (format 1)" in proc.stderr
    assert "loss.kd.partial: false" in proc.stderr


def test_an_aligned_only_cache_still_serves_a_student_with_partial_off(aligned_only, make_cfg, tmp_path):
    from trainguard.recipes.distill.train import train

    cfg = make_cfg(data__window_chars=160, data__teacher_cache=str(aligned_only), loss__hidden__start=0.0,
                   loss__hidden__end=0.0, loss__kd__top_k=16, loss__kd__partial=False, train__max_steps=2,
                   train__eval_every=2, train__save_every=2, optim__warmup_steps=1)
    r = train(cfg, run_dir=tmp_path / "s", verbose=False)
    assert r["step"] == 2 and all(np.isfinite(r["losses"]))


def test_a_damaged_shard_is_one_line_exit_2_and_the_build_makes_it_again(built, tmp_path):
    """A shard cut short (a full disk, an interrupted copy): reading it is one line and exit 2 naming the fix;
    the build run again makes that shard anew, byte for byte what it was, and the guard says completed."""
    import shutil

    cfg, folder, _, again = built
    cut = tmp_path / "cut"
    shutil.copytree(folder, cut)
    shard = cut / "shard-00001.npz"
    whole = shard.read_bytes()
    shard.write_bytes(whole[:1000])
    proc = subprocess.run([sys.executable, "-m", "trainguard.recipes.distill", "cache", "info", str(cut)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "is damaged" in proc.stderr, proc.stderr
    fixed = build_cache(cfg, cut, k=32, shard_windows=40, run_dir=str(tmp_path / "run"), verbose=False)
    assert fixed["written"] == 1 and fixed["kept"] == again["shards"] - 1 and fixed["complete"]
    assert shard.read_bytes() == whole
    with RunReader(fixed["run_dir"]) as reader:
        assert reader.status()["state"] == "completed"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without a CUDA device")
def test_device_cuda_without_cuda_is_one_line_and_exit_2(built, tmp_path):
    _, folder, _, _ = built
    proc = subprocess.run([sys.executable, "-m", "trainguard.recipes.distill", "bundled", "--device", "cuda",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no CUDA device" in proc.stderr, proc.stderr
