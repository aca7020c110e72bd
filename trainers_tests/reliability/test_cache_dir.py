"""A presample cache directory that is a file (or lies under one) is refused when the config is built,
naming the option (or $TRL_VARIANTS_CACHE) and the fix; it used to fail only in the offline pass, after the model
load. Only configs are constructed here: no model, no data."""

import re

import pytest

from trl_variants import APOConfig, ComposedConfig, DPHConfig
from trl_variants.presample import PresampleConfig

CPU = dict(output_dir="x", use_cpu=True, bf16=False)
# each config with the option, built with the cache directory `cache`
CONFIGS = {
    "DPHConfig.presample_cache_dir": lambda cache: DPHConfig(**CPU, presample_cache_dir=cache),
    "APOConfig.presample_cache_dir": lambda cache: APOConfig(**CPU, presample_cache_dir=cache),
    "ComposedConfig.presample_cache_dir": lambda cache: ComposedConfig(**CPU, presample_cache_dir=cache),
    "PresampleConfig.cache_dir": lambda cache: PresampleConfig(cache_dir=cache),
}


@pytest.fixture
def a_file(tmp_path, monkeypatch):
    monkeypatch.delenv("TRL_VARIANTS_CACHE", raising=False)
    path = tmp_path / "cache"
    path.write_text("not a directory")
    return path


@pytest.mark.parametrize("field", sorted(CONFIGS))
def test_cache_dir_that_is_a_file_is_refused_at_config_time(field, a_file):
    file, under = re.escape(str(a_file)), re.escape(str(a_file / "sub"))
    with pytest.raises(ValueError, match=rf"^{field}: {file} is a file, not a directory .*: pass --.*cache_dir DIR"):
        CONFIGS[field](str(a_file))
    with pytest.raises(ValueError, match=rf"^{field}: {under} is under {file}, a file, not a directory"):
        CONFIGS[field](str(a_file / "sub"))


@pytest.mark.parametrize("field", sorted(CONFIGS))
def test_env_cache_that_is_a_file_is_refused_when_it_is_the_default(field, a_file, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_VARIANTS_CACHE", str(a_file))
    file = re.escape(str(a_file))
    with pytest.raises(ValueError, match=rf"^\$TRL_VARIANTS_CACHE={file} \(the default {field}\) is a file, not a "
                                         "directory: point TRL_VARIANTS_CACHE at a directory"):
        CONFIGS[field](None)
    CONFIGS[field](str(tmp_path / "elsewhere"))  # an explicit directory wins over the variable


@pytest.mark.parametrize("field", sorted(CONFIGS))
def test_directories_and_missing_paths_are_accepted(field, tmp_path, monkeypatch):
    monkeypatch.delenv("TRL_VARIANTS_CACHE", raising=False)
    CONFIGS[field](None)
    CONFIGS[field](str(tmp_path))
    CONFIGS[field](str(tmp_path / "new" / "cache"))  # created by the pass
    monkeypatch.setenv("TRL_VARIANTS_CACHE", str(tmp_path / "env"))
    CONFIGS[field](None)


def test_not_checked_where_no_cache_is_used(a_file, monkeypatch):
    monkeypatch.setenv("TRL_VARIANTS_CACHE", str(a_file))
    ComposedConfig(**CPU, parts=["erpo_query_weights", "erpo_query_kl"])  # no offline pass with a cache
    PresampleConfig(use_cache=False)  # recomputes and stores nothing
