from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import StorageError
from autotune.study.storage import check_study_name, open_storage, redact


@pytest.mark.parametrize("name", ["../evil", "a/b", "", ".hidden", "x" * 200, "a..b"])
def test_bad_study_names(name):
    with pytest.raises(StorageError, match="--study"):
        check_study_name(name)


def test_good_study_name():
    assert check_study_name("llama7b-h200_v1.2") == "llama7b-h200_v1.2"


@pytest.mark.parametrize("url", ["redis://localhost/0", "not a url", "http://example/x"])
def test_bad_storage_urls(url):
    with pytest.raises(StorageError, match="--storage"):
        open_storage(url)


def test_redact_hides_password():
    assert "s3cret" not in redact("postgresql://user:s3cret@db:5432/autotune")
    assert "user" in redact("postgresql://user:s3cret@db:5432/autotune")


def test_sqlite_creates_its_directory(tmp_path: Path):
    open_storage(f"sqlite:///{tmp_path}/deep/dir/s.db")
    assert (tmp_path / "deep" / "dir" / "s.db").is_file()


def test_an_unreachable_database_server_is_a_clear_error():
    # nothing listens on port 1: the connection is refused at once
    with pytest.raises(StorageError, match="cannot open the study database") as info:
        open_storage("postgresql://autotune:pw@127.0.0.1:1/autotune")
    assert "pw" not in str(info.value).replace("postgresql", "")


def test_a_worker_joining_a_study_created_a_moment_ago_waits_for_its_settings(tmp_path, monkeypatch):
    """Two workers started together: one creates the study, the other must not read it in the
    instant before its settings are stored (seen in CI on PostgreSQL)."""
    import threading

    import optuna

    from autotune.errors import StudyError
    from autotune.study import lifecycle
    from autotune.study.settings import SETTINGS_ATTR, StudySettings

    settings = StudySettings(
        model="m",
        workload={"kind": "synthetic", "count": 8, "input_len": 8, "output_len": 8, "prefix_len": 0},
        space={"fixed": {}, "parameters": {"max_num_seqs": {"type": "int", "low": 1, "high": 512}}},
    )
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/w.db")
    created = optuna.create_study(study_name="w", storage=storage)  # the creator, settings not yet stored
    later = threading.Timer(0.5, lambda: created.set_user_attr(SETTINGS_ATTR, settings.to_dict()))
    later.start()
    study, stored, made = lifecycle.create_or_resume("w", storage, settings)
    later.join()
    assert not made and stored == settings and study.study_name == "w"

    # a study someone else made and left empty: a clear error, not a wait forever
    optuna.create_study(study_name="foreign", storage=storage)
    monkeypatch.setattr(lifecycle, "SETTINGS_WAIT_S", 0.2)
    with pytest.raises(StudyError, match=r"holds no vllm-autotune settings .* give another --study name"):
        lifecycle.create_or_resume("foreign", storage, settings)
