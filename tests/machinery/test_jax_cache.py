"""The test sessions' JAX cache folder is kept only after a session that ended normally, and
only within its size limit (tests/machinery/jax_cache.py; conftest.py opens and closes it)."""

import os

import pytest

from tests.machinery import jax_cache


def entry(folder, name="jit_step-0123", size=10):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def test_a_folder_closed_by_a_normal_session_is_kept_for_the_next(tmp_path):
    folder = tmp_path / "cache"
    assert jax_cache.open_for_session(folder) == "new"
    kept = entry(folder / "gw0")
    jax_cache.close_after_session(folder)
    assert jax_cache.open_for_session(folder) == "kept"
    assert kept.read_bytes() == b"x" * 10
    assert not (folder / jax_cache.CLEAN_MARK).exists()  # open again until this session closes it


def test_a_folder_whose_session_was_killed_is_emptied(tmp_path):
    folder = tmp_path / "cache"
    jax_cache.open_for_session(folder)
    cut_short = entry(folder / "gw1", size=3)  # a write a kill stopped halfway; no close_after_session
    assert jax_cache.open_for_session(folder) == "emptied (the session that last used it did not end normally)"
    assert not cut_short.exists() and list(folder.iterdir()) == []


def test_a_folder_over_the_size_limit_is_emptied(tmp_path):
    folder = tmp_path / "cache"
    jax_cache.open_for_session(folder)
    entry(folder, "a", size=600)
    entry(folder / "gw0", "b", size=500)
    jax_cache.close_after_session(folder)
    assert jax_cache.open_for_session(folder, size_limit=2000) == "kept"
    jax_cache.close_after_session(folder)
    assert jax_cache.open_for_session(folder, size_limit=1000).startswith("emptied (")
    assert list(folder.iterdir()) == []


def test_a_linked_folder_is_emptied_in_place_and_a_file_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "cache"
    os.symlink(target, link)
    entry(target)
    assert jax_cache.open_for_session(link).startswith("emptied (")  # never closed
    assert link.is_symlink() and target.is_dir() and list(target.iterdir()) == []
    outside = entry(tmp_path, "outside")
    os.symlink(outside, target / "link-to-outside")
    jax_cache.open_for_session(link)  # emptied again: the link goes, not what it points to
    assert outside.exists() and list(target.iterdir()) == []
    plain = entry(tmp_path, "a-file")
    with pytest.raises(ValueError, match="expected a folder, found a file"):
        jax_cache.open_for_session(plain)
    assert plain.exists()


def test_a_normal_end_shares_every_workers_entries_with_every_worker_and_counts_each_file_once(tmp_path):
    folder = tmp_path / "cache"
    jax_cache.open_for_session(folder)
    entry(folder / "gw0", "jit_a-cache", size=100)
    entry(folder / "gw1", "jit_b-cache", size=200)
    entry(folder, "jit_c-cache", size=300)  # a run without workers
    jax_cache.close_after_session(folder)
    for place in (folder, folder / "gw0", folder / "gw1"):
        files = sorted(path.name for path in place.iterdir() if path.is_file() and path.name != jax_cache.CLEAN_MARK)
        assert files == ["jit_a-cache", "jit_b-cache", "jit_c-cache"], place
    assert (folder / "gw1" / "jit_a-cache").read_bytes() == b"x" * 100
    marks = len((folder / jax_cache.CLEAN_MARK).read_bytes())
    assert jax_cache.folder_size(folder) == 600 + marks  # linked three times, counted once


def test_a_second_session_at_once_cannot_take_the_folder_until_the_first_lets_go(tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir()
    first = jax_cache.lock(folder)
    assert first is not None
    assert jax_cache.lock(folder) is None  # a second open file: as another process would see it
    first.close()
    again = jax_cache.lock(folder)
    assert again is not None
    again.close()
