"""Security: credentials in URIs are used but never stored or logged; ``sweep --resume`` refuses
to unpickle Tune state someone else could have written; a local Ray starts without its
dashboard (and Jobs API) unless asked."""

from __future__ import annotations

import json
import os
import pickle
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.config import PretrainConfig, from_dict, to_dict
from components.io import storage
from components.io.storage import has_credentials, redact, redacted
from components.sweep.state import (
    DIGEST_FILE,
    UntrustedSweepState,
    check,
    check_local,
    check_record,
    key_path,
    record,
    state_files,
)

KEY, SECRET = "AKIAEXAMPLEKEY", "s3cr3t/with+slash"  # a "/" as AWS secrets have
OTHER_SECRET = "another-secret"


def _with_credentials(uri: str, secret: str = SECRET) -> str:
    """``uri`` with ``KEY:secret@`` (the secret percent-encoded, as a URI needs it)."""
    from urllib.parse import quote

    scheme, rest = uri.split("://", 1)
    return f"{scheme}://{KEY}:{quote(secret, safe='')}@{rest}"


def _config(storage_uri: str, dataset: str, **extra: Any) -> PretrainConfig:
    return from_dict(PretrainConfig, {"name": "r", "storage": storage_uri,
                                      "data": {"dataset": dataset}, **extra})


def _no_secret(data: bytes | str) -> bool:
    raw = data.encode() if isinstance(data, str) else data
    return all(s.encode() not in raw for s in (KEY, SECRET, OTHER_SECRET, "s3cr3t"))


# ---------------------------------------------------------------------------------------------
# 1. Credentials in URIs.


@pytest.mark.parametrize(("given", "stored"), [
    ("s3://K:S@bucket/runs?endpoint_override=127.0.0.1:9000&scheme=http",
     "s3://bucket/runs?endpoint_override=127.0.0.1:9000&scheme=http"),
    (f"s3://{KEY}:{SECRET}@bucket/runs", "s3://bucket/runs"),  # a raw "/" (pyarrow refuses
    # it, but its error message quotes the URI: redacted too)
    ("gs://anonymous@bucket/x", "gs://bucket/x"),
    ("storage=s3://K:S@bucket/x", "storage=s3://bucket/x"),  # an override on a command line
    ("postgresql://user:pw@db.host:5432/optuna", "postgresql://db.host:5432/optuna"),
    ("s3://bucket/a@b/c", "s3://bucket/a@b/c"),  # an "@" in a key is not a credential
    ("http://host:8080/p@x", "http://host:8080/p@x"),  # nor after a port
    ("/local/dir@2", "/local/dir@2"),
    ("s3://bucket/runs", "s3://bucket/runs"),
])
def test_redact_removes_the_userinfo_of_every_uri(given: str, stored: str) -> None:
    assert redact(given) == stored
    assert storage.display(given) == stored
    assert has_credentials(given) == (given != stored)


def test_a_whole_config_is_redacted_and_nothing_else_changes() -> None:
    cfg = to_dict(_config(_with_credentials("s3://bucket/runs?region=eu-west-1"),
                          _with_credentials("s3://data/ds"),
                          tracking={"mlflow": True,
                                    "mlflow_uri": "postgresql://u:dbpass@h/mlflow"}))
    out = redacted(cfg)
    assert _no_secret(yaml.safe_dump(out)) and "dbpass" not in yaml.safe_dump(out)
    assert out["storage"] == "s3://bucket/runs?region=eu-west-1"
    assert out["data"]["dataset"] == "s3://data/ds"
    assert out["tracking"]["mlflow_uri"] == "postgresql://h/mlflow"
    out["storage"], out["data"]["dataset"] = cfg["storage"], cfg["data"]["dataset"]
    out["tracking"]["mlflow_uri"] = cfg["tracking"]["mlflow_uri"]
    assert out == cfg  # only the credentials went
    assert _with_credentials("s3://data/ds") in yaml.safe_dump(cfg)  # the input is untouched


def test_run_dir_stores_no_credentials_and_resumes_with_any(s3_uri: str) -> None:
    """config.yaml (and everything else in the run dir) holds no secret; the same run with the
    same or other credentials resumes; another dataset bucket is another run."""
    from components.runs.errors import RunError
    from components.runs.run_dir import prepare_run_dir

    runs = _with_credentials(storage.join(s3_uri, "runs"))
    dataset = _with_credentials(storage.join(s3_uri, "ds"))
    ident = {"params_digest": "p", "splits": {"train": "x"}, "classes": ["a"]}
    run_dir = prepare_run_dir(_config(runs, dataset), ident)
    assert not _no_secret(run_dir)  # the run dir itself is used with them
    fs, base = storage.resolve(s3_uri)
    import pyarrow.fs as pafs

    files = [i.path for i in fs.get_file_info(pafs.FileSelector(base, recursive=True))
             if i.type == pafs.FileType.File]
    assert any(f.endswith("config.yaml") for f in files)
    for f in files:
        with fs.open_input_stream(f) as stream:
            assert _no_secret(stream.read()), f
    stored = yaml.safe_load(storage.read_text(storage.join(run_dir, "config.yaml")))
    assert stored["data"]["dataset"] == storage.display(dataset)

    assert prepare_run_dir(_config(runs, dataset), ident) == run_dir  # same credentials
    other = _with_credentials(storage.join(s3_uri, "ds"), OTHER_SECRET)
    prepare_run_dir(_config(runs, other), ident)  # other credentials: the same run
    prepare_run_dir(_config(storage.display(runs), storage.display(dataset)), ident)  # none
    elsewhere = _with_credentials(s3_uri.replace("s3://", "s3://another-").replace(
        "/data?", "/ds?"))
    with pytest.raises(RunError, match="data.dataset differ"):
        prepare_run_dir(_config(runs, elsewhere), ident)


def test_a_datasets_build_parameters_hold_no_credentials() -> None:
    """What a dataset's manifest stores as its build parameters (and digests into its
    identity) holds no credential of a source URI; other keys to the same data are the same
    build."""
    from components.config import PreprocessConfig
    from components.data.build.common import _digest
    from components.data.build.planning import _params

    def cfg(path: str) -> PreprocessConfig:
        return from_dict(PreprocessConfig, {"output": "/tmp/ds", "source": {
            "kind": "folder", "path": path}})

    params = _params(cfg(_with_credentials("s3://data/images")))
    assert params["source"]["path"] == "s3://data/images"
    assert _no_secret(json.dumps(params).encode())
    assert _digest(params) == _digest(_params(cfg(_with_credentials(
        "s3://data/images", OTHER_SECRET)))) == _digest(_params(cfg("s3://data/images")))
    assert _digest(params) != _digest(_params(cfg("s3://data/other")))


def test_checkpoints_hold_the_config_without_credentials(tmp_path: Path) -> None:
    import torch

    from components.runs.checkpoint import checkpoint_state, load_state

    cfg = _config(_with_credentials("s3://bucket/runs"), _with_credentials("s3://data/ds"))
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    state = checkpoint_state(cfg, model=model, ema=None, optimizer=optimizer,
                             scheduler=scheduler, scaler=None, epoch=1, step=3, history=[],
                             dataset={"params_digest": "p"})
    assert state.config == redacted(to_dict(cfg))
    state.save(tmp_path / "ckpt")
    for f in (tmp_path / "ckpt").rglob("*"):
        if f.is_file():
            assert _no_secret(f.read_bytes()), f
    assert load_state(tmp_path / "ckpt")["config"]["storage"] == "s3://bucket/runs"


def test_mlflow_params_hold_no_credentials(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    from components.training.tracking import DB_FILE, MLflowRun, default_uri

    cfg = _config(_with_credentials("s3://bucket/runs"), _with_credentials("s3://data/ds"),
                  tracking={"mlflow": True})
    run = MLflowRun(tmp_path, "r", to_dict(cfg), uri=None, experiment="simgraph")
    run.finish()
    params = mlflow.MlflowClient(default_uri(tmp_path)).get_run(run.run_id).data.params
    assert params["storage"] == "s3://bucket/runs" and params["data.dataset"] == "s3://data/ds"
    assert _no_secret(json.dumps(params))
    assert _no_secret((tmp_path / DB_FILE).read_bytes())


class _Trial:
    """What Ray's tracker callbacks read of a Tune trial."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.trial_id = "t1"

    def __str__(self) -> str:
        return "trial_t1"


def test_sweep_mlflow_callback_logs_trial_parameters_without_credentials(
        tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    from components.training.tune_trackers import RedactingMLflowLoggerCallback

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    cb = RedactingMLflowLoggerCallback(tracking_uri=uri, experiment_name="s",
                                       save_artifact=False)
    cb.setup()
    config = {"data.dataset": _with_credentials("s3://data/ds"), "optim.lr": 0.1}
    trial = _Trial(dict(config))
    cb.log_trial_start(trial)
    assert trial.config == config  # Tune's own copy is left as it was
    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("s").experiment_id])
    assert run.data.params == {"data.dataset": "s3://data/ds", "optim.lr": "0.1"}
    # Tune pickles its callbacks into the sweep's state: by reference, and back.
    assert pickle.loads(pickle.dumps(RedactingMLflowLoggerCallback)) is \
        RedactingMLflowLoggerCallback


def test_submitted_job_metadata_holds_no_credentials(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import ray.job_submission

    from components.deploy import cluster

    sent: dict[str, Any] = {}

    class Client:
        def __init__(self, address: str) -> None:
            pass

        def submit_job(self, **kwargs: Any) -> str:
            sent.update(kwargs)
            return str(kwargs["submission_id"])

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", Client)
    # submit turns on Ray's token mode in os.environ for its client; kept out of this
    # process, whose later tests start local Rays with the mode Ray was imported with
    monkeypatch.setattr(cluster, "use_token_if_present", lambda: False)
    argv = ["pretrain", "pipelines/configs/pretrain/demo.yaml",
            f"storage={_with_credentials('s3://bucket/runs')}"]
    assert cluster.submit(argv, {}, "http://127.0.0.1:8265", "job1", wait=False) == 0
    assert _no_secret(json.dumps(sent["metadata"]))
    assert sent["metadata"]["simgraph"].endswith("storage=s3://bucket/runs")
    assert KEY in sent["entrypoint"]  # the job needs them
    assert "the command holds URI credentials" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# 2. Tune state that someone else could have written.


def _tune_state(sweep_dir: Path) -> Path:
    """The files Ray Tune 2.60 leaves in a sweep dir (their names; the content is not read)."""
    (sweep_dir / "trial_fn_abc_00000").mkdir(parents=True)
    for rel in ("tuner.pkl", "experiment_state-2026-11-25_08-00-00.json",
                "searcher-state-2026-11-25_08-00-00.pkl", "search_gen_state-2026.json",
                "callback-states-2026.pkl", "trial_fn_abc_00000/error.pkl",
                "trial_fn_abc_00000/params.pkl", "trial_fn_abc_00000/result.json", "trials.csv"):
        (sweep_dir / rel).write_bytes(b"state " + rel.encode())
    for p in [sweep_dir, *sweep_dir.rglob("*")]:
        p.chmod(0o700 if p.is_dir() else 0o600)
    return sweep_dir


def test_state_files_are_what_tune_unpickles(tmp_path: Path) -> None:
    d = _tune_state(tmp_path / "s")
    assert state_files(str(d)) == [
        "callback-states-2026.pkl", "experiment_state-2026-11-25_08-00-00.json",
        "search_gen_state-2026.json", "searcher-state-2026-11-25_08-00-00.pkl",
        "trial_fn_abc_00000/error.pkl", "trial_fn_abc_00000/params.pkl", "tuner.pkl"]


def _sweep_file(tmp: Path) -> Path:
    (tmp / "ds").mkdir(exist_ok=True)  # the sweep's pre-flight looks for its manifest
    (tmp / "ds" / "manifest.json").write_text("{}")
    (tmp / "base.yaml").write_text(yaml.safe_dump({"name": "b",
                                                   "data": {"dataset": str(tmp / "ds")}}))
    space = {"name": "s", "storage": str(tmp / "sweeps"), "base": str(tmp / "base.yaml"),
             "metric": "knn_top1", "mode": "max", "num_samples": 2,
             "searcher": {"name": "random", "seed": 0},
             "space": {"optim.lr": {"loguniform": [0.01, 0.5]}}}
    (tmp / "space.yaml").write_text(yaml.safe_dump(space))
    return tmp / "space.yaml"


def test_resume_refuses_a_world_writable_tuner_state_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import ray

    from components.runtime import session
    from components.sweep.driver import run
    from components.sweep.layout import SweepError

    space = _sweep_file(tmp_path)
    d = _tune_state(tmp_path / "sweeps" / "s")
    check_local(d)  # ours alone: fine
    (d / "tuner.pkl").chmod(0o666)

    class Started(Exception):
        pass

    def no_ray(num_cpus: int | None, needs_dashboard: bool = False) -> Any:
        raise Started

    monkeypatch.setattr(session, "ray_session", no_ray)
    with pytest.raises(SweepError) as e:
        run(str(space), resume=True, echo=False)
    msg = str(e.value)
    assert f"--resume would unpickle {d / 'tuner.pkl'}" in msg
    assert "it is writable by everyone" in msg and f"chmod go-w {d / 'tuner.pkl'}" in msg
    assert "--trust-sweep-dir" in msg
    assert not ray.is_initialized()
    with pytest.raises(Started):  # --trust-sweep-dir: on to Ray (here: stopped at its start)
        run(str(space), resume=True, echo=False, trust=True)

    # The command line: one line and exit 1; the flag reaches run().
    from pipelines.cli import main

    assert main(["sweep", str(space), "--resume"]) == 1
    assert "--resume would unpickle" in capsys.readouterr().err
    with pytest.raises(Started):
        main(["sweep", str(space), "--resume", "--trust-sweep-dir"])


def test_resume_refuses_state_in_a_directory_others_can_write(tmp_path: Path) -> None:
    d = _tune_state(tmp_path / "s")
    shared = _shared_group(d / "trial_fn_abc_00000", d / "searcher-state-2026-11-25_08-00-00.pkl")
    (d / "trial_fn_abc_00000").chmod(0o770)  # its group may replace the files in it
    if shared:
        with pytest.raises(UntrustedSweepState, match=r"error.pkl .*its directory .*"
                                                      r"trial_fn_abc_00000 is writable by its "
                                                      "group"):
            check_local(d)
    (d / "trial_fn_abc_00000").chmod(0o777)
    with pytest.raises(UntrustedSweepState, match="trial_fn_abc_00000 is writable by everyone"):
        check_local(d)
    (d / "trial_fn_abc_00000").chmod(0o1777)  # sticky, as /tmp: others cannot replace ours
    check_local(d)
    (d / "searcher-state-2026-11-25_08-00-00.pkl").chmod(0o620)
    if shared:
        with pytest.raises(UntrustedSweepState, match="searcher-state.* is writable by its "
                                                      "group"):
            check_local(d)


def _shared_group(*paths: Path) -> bool:
    """Give ``paths`` a group other than this user's private one (root can); whether they
    have one now (else group write is this user's own and allowed)."""
    from components.sweep.state import _private_group

    if os.getuid() == 0:
        for p in paths:
            os.chown(p, -1, 4242)
    return not any(_private_group(p.stat().st_gid) for p in paths)


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_resume_refuses_state_owned_by_another_user(tmp_path: Path) -> None:
    d = _tune_state(tmp_path / "s")
    os.chown(d / "experiment_state-2026-11-25_08-00-00.json", 4242, -1)
    with pytest.raises(UntrustedSweepState, match=r"experiment_state-.*\.json .* it is owned by "
                                                  r"another user \(uid 4242\)"):
        check_local(d)


def test_uri_sweep_state_must_match_the_signed_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record's logic on a local dir standing in for a URI (same storage calls)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    d = _tune_state(tmp_path / "s")
    with pytest.raises(UntrustedSweepState, match=f"no {DIGEST_FILE} .*killed.*"
                                                  "--trust-sweep-dir"):
        check_record(str(d))
    record(str(d))
    assert stat.S_IMODE(key_path().stat().st_mode) == 0o600
    check_record(str(d))
    (d / "trials.csv").write_text("not state")  # not unpickled: free to change
    check_record(str(d))

    searcher = d / "searcher-state-2026-11-25_08-00-00.pkl"
    searcher.write_bytes(b"a payload")
    with pytest.raises(UntrustedSweepState, match="searcher-state.*changed since the last sweep "
                                                  "run recorded it.*--trust-sweep-dir"):
        check_record(str(d))
    record(str(d))
    (d / "experiment_state-2027.json").write_text("{}")  # newer: Tune would read this one
    with pytest.raises(UntrustedSweepState, match="experiment_state-2027.json .*not in the "
                                                  "record"):
        check_record(str(d))
    (d / "experiment_state-2027.json").unlink()

    # A record rewritten by someone without this user's key.
    saved = json.loads((d / DIGEST_FILE).read_text())
    saved["files"]["tuner.pkl"] = "0" * 64
    (d / DIGEST_FILE).write_text(json.dumps(saved))
    with pytest.raises(UntrustedSweepState, match="not signed with your key"):
        check_record(str(d))
    record(str(d))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "someone-else"))  # another machine
    with pytest.raises(UntrustedSweepState, match="not signed with your key"):
        check_record(str(d))


def test_an_s3_sweep_dir_is_checked_against_its_record(
        s3_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    sweep = storage.join(s3_uri, "sweeps", "s")
    storage.upload_dir(_tune_state(tmp_path / "s"), sweep)
    with pytest.raises(UntrustedSweepState, match=f"no {DIGEST_FILE}"):
        check(sweep)
    record(sweep)
    check(sweep)
    storage.write_bytes(storage.join(sweep, "tuner.pkl"), b"a payload")
    with pytest.raises(UntrustedSweepState, match=r"tuner.pkl\?.*changed"):
        check(sweep)
    check(storage.join(s3_uri, "sweeps", "none"))  # nothing to resume: nothing to check


# ---------------------------------------------------------------------------------------------
# 3. Local Rays: no dashboard (no Jobs API) unless asked.


@pytest.mark.parametrize(("env", "needed", "dashboard"), [
    ({}, False, False), ({"SIMGRAPH_RAY_DASHBOARD": "0"}, False, False),
    ({"SIMGRAPH_RAY_DASHBOARD": "1"}, False, True),
    ({"SIMGRAPH_RAY_DASHBOARD": "true"}, False, True),
    # A sweep whose trials have their own Train worker group needs its State API ...
    ({}, True, True),
    # ... unless the environment says no (the test suite's setting).
    ({"SIMGRAPH_RAY_DASHBOARD": "0"}, True, False),
])
def test_a_local_ray_starts_without_its_dashboard_unless_asked(
        env: dict[str, str], needed: bool, dashboard: bool) -> None:
    from components.runtime.session import init_kwargs

    kwargs = init_kwargs(2, env, needs_dashboard=needed)
    assert kwargs["address"] == "local" and kwargs["num_cpus"] == 2
    assert kwargs["include_dashboard"] is dashboard


def test_only_sweeps_with_train_worker_groups_ask_for_the_dashboard(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from components.runtime import session
    from components.sweep.driver import run

    asked: list[bool] = []

    class Started(Exception):
        pass

    def no_ray(num_cpus: int | None, needs_dashboard: bool = False) -> Any:
        asked.append(needs_dashboard)
        raise Started

    monkeypatch.setattr(session, "ray_session", no_ray)
    space = _sweep_file(tmp_path)
    for mode in ("in_trial", "worker_group"):
        with pytest.raises(Started):
            run(str(space), [f"resources.mode={mode}", f"name={mode}"], echo=False)
    assert asked == [False, True]


def test_joining_a_cluster_leaves_its_dashboard_alone() -> None:
    from components.runtime.session import init_kwargs

    kwargs = init_kwargs(None, {"RAY_ADDRESS": "ray://head:10001",
                                "SIMGRAPH_RAY_DASHBOARD": "1"})
    assert "include_dashboard" not in kwargs and "address" not in kwargs



def test_resuming_a_sweep_dir_without_its_record_warns_and_changes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A sweep dir without ``sweep.json`` (nothing to compare the files given now with): one
    warning naming the dir and the record, no history in it, and nothing in the dir touched."""
    from components.search_space import SWEEP_RECORD, load_sweep
    from components.sweep.resume import check_resume

    space = Path(__file__).resolve().parents[2] / "search_spaces" / "xclr_temperature.yaml"
    sweep = load_sweep(space, [f"storage={tmp_path}", "name=s"])
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "trials.csv").write_text("trial,status\n")
    check_resume(sweep, {"anything": 1})
    said = capsys.readouterr().out
    assert f"has no {SWEEP_RECORD} (the record of the files the sweep started from)" in said
    assert "older" not in said and str(tmp_path / "s") in said
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["trials.csv"]
