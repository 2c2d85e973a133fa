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
