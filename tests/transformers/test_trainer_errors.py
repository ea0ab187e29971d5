"""StreamioTrainer in one process (the real Trainer, a tiny GPT-2 from a config, S3 on moto): what it
refuses, each refusal's class and message, and the root and the model as they were after it."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from streamio import CheckpointManager, Preemption, RetryPolicy, StreamingDataset
from streamio.checkpoint.root import committed_saves
from streamio.errors import (
    ArgumentError,
    CheckpointConflictError,
    CheckpointError,
    CheckpointNotFoundError,
    ConfigError,
    MissingDependencyError,
    StateMismatchError,
    StorageError,
)
from streamio.storage import Store
from streamio.testing import S3Endpoint

transformers = pytest.importorskip("transformers")
from support.transformers_ddp import SEQ, VOCAB, Collate, Counter, write_tokens  # noqa: E402 - needs transformers

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("tokens") / "ds")
    write_tokens(url, None, 8)
    return url


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _model() -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=8, n_layer=1, n_head=2,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def _trainer(tmp_path: Path, root: str, data: Any, *, storage_options: Any = None, steps: int = 2,
             preemption: Any = None, **overrides: Any) -> Any:
    from streamio.transformers import StreamioTrainer

    options = {"output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 2, "max_steps": steps,
               "save_steps": 2, "report_to": "none", "use_cpu": True, "remove_unused_columns": False,
               "disable_tqdm": True, **overrides}
    train = data if not isinstance(data, str) else StreamingDataset(data, batch_size=2, decode="auto",
                                                                     transform=Counter())
    return StreamioTrainer(model=_model(), args=transformers.TrainingArguments(**options), data_collator=Collate(),
                           train_dataset=train, checkpoint_root=root, storage_options=storage_options,
                           retry=RetryPolicy(max_attempts=2, max_total=5), preemption=preemption)


def _weights(trainer: Any) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def saved(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory, dataset: str) -> tuple[S3Endpoint, str]:
    """A root holding one StreamioTrainer save (step 2), made by train(resume_from_checkpoint=True) on an empty root."""
    s3 = S3Endpoint(moto_endpoint, "unused").new_bucket()
    tmp = tmp_path_factory.mktemp("saved")
    trainer = _trainer(tmp, s3.url("ckpt"), dataset, storage_options=s3.storage_options())
    trainer.train(resume_from_checkpoint=True)
    assert trainer.resumed_step is None and trainer.state.global_step == 2  # an empty root: a fresh start
    assert not (tmp / "out" / "checkpoint-2").exists()  # nothing in output_dir's checkpoint folders
    return s3, s3.url("ckpt")


def _kept(s3: S3Endpoint, root: str) -> list[int]:
    return [s.step for s in committed_saves(Store(root, s3.storage_options()))]


@pytest.mark.slow  # a Trainer run, or a restore over moto: 2-8 s each
def test_true_on_an_empty_root_starts_fresh_and_saves_there(saved: tuple[S3Endpoint, str]) -> None:
    assert _kept(*saved) == [2]


@pytest.mark.slow  # a Trainer run, or a restore over moto: 2-8 s each
def test_a_fresh_start_on_a_root_with_checkpoints_is_refused_and_the_root_kept(
        saved: tuple[S3Endpoint, str], tmp_path: Path, dataset: str) -> None:
    s3, root = saved
    again = _trainer(tmp_path, root, dataset, storage_options=s3.storage_options())
    before = _weights(again)
    with pytest.raises(CheckpointConflictError) as info:
        again.train()
    assert f"checkpoint_root {root} holds step 2 of an earlier run" in str(info.value)
    assert "pass resume_from_checkpoint=True" in str(info.value)
    assert _kept(s3, root) == [2]
    assert _same(before, _weights(again))


@pytest.mark.slow  # a Trainer run, or a restore over moto: 2-8 s each
def test_resume_values_that_name_nothing_here_are_refused(
        saved: tuple[S3Endpoint, str], tmp_path: Path, dataset: str) -> None:
    s3, root = saved
    trainer = _trainer(tmp_path, root, dataset, storage_options=s3.storage_options())
    before = _weights(trainer)
    with pytest.raises(ArgumentError, match="resumes only from its own root"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    with pytest.raises(CheckpointNotFoundError) as info:
        trainer.train(resume_from_checkpoint="step-7")
    assert f"found nothing to resume in {root}" in str(info.value)
    assert _kept(s3, root) == [2]
    assert _same(before, _weights(trainer))


@pytest.mark.slow  # a Trainer run, or a restore over moto: 2-8 s each
def test_a_checkpoint_of_other_data_is_refused_before_anything_is_loaded(
        saved: tuple[S3Endpoint, str], tmp_path: Path) -> None:
    s3, root = saved
    other = s3.url("ds2")
    write_tokens(other, s3.storage_options(), 10)
    data = StreamingDataset(other, batch_size=2, decode="auto", transform=Counter(),
                            storage_options=s3.storage_options())
    trainer = _trainer(tmp_path, root, data, storage_options=s3.storage_options())
    before = _weights(trainer)
    with pytest.raises(StateMismatchError) as info:
        trainer.train(resume_from_checkpoint=True)
    assert f"{root} step 2 holds the position of other data" in str(info.value)
    assert _same(before, _weights(trainer))
    assert _kept(s3, root) == [2]


@pytest.mark.slow  # a Trainer run, or a restore over moto: 2-8 s each
def test_a_checkpoint_of_another_model_is_refused_before_anything_is_loaded(
        saved: tuple[S3Endpoint, str], tmp_path: Path, dataset: str) -> None:
    s3, root = saved
    trainer = _trainer(tmp_path, root, dataset, storage_options=s3.storage_options())
    trainer.model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=4, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0))
    before = _weights(trainer)
    with pytest.raises(CheckpointError) as info:
        trainer.train(resume_from_checkpoint=True)
    assert f"{root} step 2 holds another model" in str(info.value)
    assert "'transformer.wte.weight' is (64, 4) torch.float32, saved (64, 8) torch.float32" in str(info.value)
    assert _same(before, _weights(trainer))


@pytest.mark.slow  # a Trainer run, or a restore over moto: 2-8 s each
def test_a_position_the_trainers_step_does_not_match_is_refused_before_the_model_changes(
        saved: tuple[S3Endpoint, str], tmp_path: Path, dataset: str) -> None:
    s3, root = saved  # saved after 2 batches of 2 (4 of 8 samples); resumed with batches of 4, the step says epoch 1
    data = StreamingDataset(dataset, batch_size=4, decode="auto", transform=Counter())
    trainer = _trainer(tmp_path, root, data, storage_options=s3.storage_options(), per_device_train_batch_size=4)
    before = _weights(trainer)
    with pytest.raises(StateMismatchError) as info:
        trainer.train(resume_from_checkpoint=True)
    assert f"{root} step 2: the saved data position leaves 1 of this rank's 2 batches of the epoch, the " \
           f"Trainer's step leaves 2" in str(info.value)
    assert "resume with the same number of processes, per_device_train_batch_size" in str(info.value)
    assert _same(before, _weights(trainer))
    assert _kept(s3, root) == [2]


@pytest.mark.slow  # a Trainer run, or a restore over moto: 2-8 s each
def test_another_programs_root_is_refused_and_nothing_is_loaded(
        s3: S3Endpoint, tmp_path: Path, dataset: str) -> None:
    root = s3.url("other")
    with CheckpointManager(root, storage_options=s3.storage_options()) as other:  # the reference trainer's, say
        other.save(5, {"model": torch.nn.Linear(2, 2), "step": {"epoch": 1}})
    trainer = _trainer(tmp_path, root, dataset, storage_options=s3.storage_options())
    before = _weights(trainer)
    with pytest.raises(CheckpointError) as info:
        trainer.train(resume_from_checkpoint=True)
    assert root in str(info.value)
    assert _same(before, _weights(trainer))
    assert _kept(s3, root) == [5]


@pytest.mark.slow  # a Trainer run, or a restore over moto: 2-8 s each
def test_an_unreachable_root_is_a_storage_error_naming_it(tmp_path: Path, dataset: str) -> None:
    options = {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9",  # nothing listens there
               "client_kwargs": {"region_name": "us-east-1"}}
    trainer = _trainer(tmp_path, "s3://nowhere/ckpt", dataset, storage_options=options)
    before = _weights(trainer)
    with pytest.raises(StorageError) as info:
        trainer.train(resume_from_checkpoint=True)
    assert "nowhere" in str(info.value)
    assert _same(before, _weights(trainer))


@pytest.mark.parametrize("overrides, says", [
    ({"per_device_train_batch_size": 4}, "per_device_train_batch_size=4 differs from the batch_size=2"),
    ({"ignore_data_skip": True}, "TrainingArguments(ignore_data_skip=True)"),
    ({"save_only_model": True}, "TrainingArguments(save_only_model=True)"),
])
def test_arguments_that_cannot_work_are_refused_at_construction(
        tmp_path: Path, dataset: str, overrides: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        _trainer(tmp_path, str(tmp_path / "ckpt"), dataset, **overrides)
    assert says in str(info.value)
    assert not (tmp_path / "ckpt").exists()


def test_a_dataset_that_is_not_streaming_is_refused(tmp_path: Path) -> None:
    data = [{"input_ids": torch.zeros(SEQ, dtype=torch.long)}] * 4
    with pytest.raises(ConfigError, match="needs train_dataset=streamio.StreamingDataset"):
        _trainer(tmp_path, str(tmp_path / "ckpt"), data)


@pytest.mark.parametrize("preemption, overrides, says", [
    ("SIGTERM", {}, "preemption='SIGTERM' must be a streamio.Preemption (e.g. preemption=streamio.Preemption())"),
    (None, {"enable_jit_checkpoint": True}, "both take SIGTERM, and the JIT checkpoint saves on the signalled rank"),
])
def test_a_preemption_that_cannot_work_is_refused_before_any_handler_is_installed(
        tmp_path: Path, dataset: str, preemption: Any, overrides: dict[str, Any], says: str) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with Preemption(("SIGUSR1",)) as stop, pytest.raises(ConfigError) as info:
        _trainer(tmp_path, str(tmp_path / "ckpt"), dataset, preemption=preemption or stop, **overrides)
    assert says in str(info.value)
    assert signal.getsignal(signal.SIGTERM) is before  # transformers' JIT handler was not installed either
    assert not (tmp_path / "ckpt").exists()


def test_without_transformers_the_error_says_what_to_install() -> None:
    from streamio.transformers.requirement import require

    with pytest.raises(MissingDependencyError, match=r"pip install 'streamio-torch\[transformers\]'"):
        require("transformers_not_installed_here")
