"""Settings sources and validation; model discovery and its safety rules."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from windve.model import ModelError, ModelSpec, load_model_spec
from windve.settings import Settings, SettingsError, load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for key in list(__import__("os").environ):
        if key.startswith("WINDVE_"):
            monkeypatch.delenv(key)


def test_defaults():
    settings = load_settings()
    assert (settings.host, settings.port, settings.engine, settings.truncate) == ("127.0.0.1", 8080, "torch", True)
    assert settings.redis_url is None and settings.model is None


def test_sources_priority(monkeypatch, tmp_path):
    config = tmp_path / "windve.yaml"
    config.write_text("port: 9000\nslo_seconds: 2.0\nmax_batch_size: 8\n")
    monkeypatch.setenv("WINDVE_SLO_SECONDS", "1.5")
    settings = load_settings(config_file=config, max_batch_size=4)
    assert settings.port == 9000  # file
    assert settings.slo_seconds == 1.5  # env beats file
    assert settings.max_batch_size == 4  # flag beats env and file


def test_a_config_file_is_not_handed_to_the_processes_started_after(tmp_path):
    config = tmp_path / "windve.yaml"
    config.write_text("slo_seconds: 2.0\n")
    assert load_settings(config_file=config).slo_seconds == 2.0
    # it had been exported as WINDVE_CONFIG: a `windve serve` started later by the same process
    # (a test, a script) ran with this file's settings
    assert "WINDVE_CONFIG" not in __import__("os").environ
    assert load_settings().slo_seconds == 1.0


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"WINDVE_PORT": "99999"}, "port"),
        ({"WINDVE_ENGINE": "tensorrt"}, "engine"),
        ({"WINDVE_SLO_SECONDS": "-1"}, "slo_seconds"),
        ({"WINDVE_MAX_BATCH_SIZE": "many"}, "max_batch_size"),
        ({"WINDVE_RESERVED_CORES": "3-1"}, "reserved_cores"),
        ({"WINDVE_REDIS_URL": "notaurl"}, "redis_url"),
        ({"WINDVE_NOT_A_SETTING": "1"}, None),
    ],
)
def test_invalid_settings_name_the_setting(monkeypatch, env, name):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if name is None:  # unknown env vars are ignored, as every WINDVE_ variable need not be ours
        load_settings()
        return
    with pytest.raises(SettingsError, match=name):
        load_settings()


@pytest.mark.parametrize(
    ("value", "cores"),
    [("3", [3]), ("0-1", [0, 1]), ("0,2", [0, 2]), ("[1, 3]", [1, 3]), ("[]", [])],
)
def test_reserved_cores_from_the_environment_take_a_cpulist(monkeypatch, value, cores):
    # a single CPU ("3") is valid JSON, which the settings library had decoded into a number
    # and refused as "not a valid list"
    monkeypatch.setenv("WINDVE_RESERVED_CORES", value)
    assert load_settings().reserved_cores == cores


@pytest.mark.parametrize("name", ["reserved_cores", "model", "http_workers", "calibration_file", "matryoshka_dims"])
def test_an_empty_variable_is_an_unset_one(monkeypatch, name):
    # Each had been read as a value: no reserved cores, a model named "", the calibration file ".",
    # or a refused start ("Input should be a valid integer").
    monkeypatch.setenv(f"WINDVE_{name.upper()}", "")
    assert getattr(load_settings(), name) is None


@pytest.mark.parametrize(("value", "dims"), [("256", [256]), ("256,128", [256, 128]), ("[128, 256]", [128, 256])])
def test_matryoshka_dims_from_the_environment_take_a_comma_list(monkeypatch, value, dims):
    monkeypatch.setenv("WINDVE_MATRYOSHKA_DIMS", value)
    assert load_settings().matryoshka_dims == dims


def test_a_matryoshka_dims_flag_takes_a_comma_list():
    assert load_settings(matryoshka_dims="64, 32").matryoshka_dims == [64, 32]
    with pytest.raises(SettingsError, match="matryoshka_dims"):
        load_settings(matryoshka_dims="64,big")


def test_a_bad_value_names_where_it_came_from(tmp_path, monkeypatch):
    # Every message had said "(env WINDVE_CPU_DEPTH)", whether the value came from a flag or a file.
    config = tmp_path / "bad.yaml"
    config.write_text("cpu_depth: 0\n")
    with pytest.raises(SettingsError, match=r"cpu_depth \(config file .*bad.yaml\)"):
        load_settings(config_file=config)
    monkeypatch.setenv("WINDVE_CPU_DEPTH", "0")
    with pytest.raises(SettingsError, match=r"cpu_depth \(env WINDVE_CPU_DEPTH\)"):
        load_settings(config_file=config)
    with pytest.raises(SettingsError, match=r"cpu_depth \(flag --cpu-depth\)"):
        load_settings(cpu_depth="0")


def test_log_level_takes_any_case(monkeypatch):
    monkeypatch.setenv("WINDVE_LOG_LEVEL", "DEBUG")
    assert load_settings().log_level == "debug"


def test_unknown_key_in_config_file_is_named(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("slo_secs: 1\n")
    with pytest.raises(SettingsError, match="unknown setting slo_secs: no such setting") as raised:
        load_settings(config_file=config)
    assert "WINDVE_SLO_SECS" not in str(raised.value)  # no such variable to point at


def test_config_file_errors(tmp_path):
    with pytest.raises(SettingsError, match="missing.yaml"):
        load_settings(config_file=tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("port: [1, 2\n")
    with pytest.raises(SettingsError, match="not valid YAML"):
        load_settings(config_file=broken)


@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--port", "0x"], "port"), (["--redis-url", "localhost:6379"], "redis_url"),
     (["--default-prompt-name", "nope"], "setting default_prompt_name: prompt_name 'nope' is not one of")],
)  # fmt: skip
def test_serve_rejects_bad_settings_at_start(tmp_path, flags, named):
    # Before the engines load: no "Uvicorn running" after a failure, and the setting named.
    result = subprocess.run(
        [sys.executable, "-m", "windve.commands.serve", *flags],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert result.returncode == 2
    assert named in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_redis_url_that_does_not_parse_stops_the_start_without_its_password():
    with pytest.raises(SettingsError) as refused:
        load_settings(redis_url="redis://:hunter2@127.0.0.1:notaport/0")
    message = str(refused.value)
    assert "invalid setting redis_url (flag --redis-url): not a Redis URL: Port could not be cast" in message
    assert "hunter2" not in message and "Value error" not in message


def test_an_empty_redis_url_is_none():
    assert Settings(redis_url="").redis_url is None and Settings(redis_url="rediss://h:6380/0").redis_url


def test_bundled_model_spec(model_spec):
    assert model_spec.name == "sentence-transformers/all-MiniLM-L6-v2"
    spec = model_spec
    assert (spec.pooling, spec.max_seq_length, spec.normalize, spec.dim) == ("mean", 256, True, 384)
    assert (spec.dense, spec.matryoshka_dims) == ((), ())
    assert len(model_spec.revision) == 16


def test_a_plain_transformer_folder_is_mean_pooled(model_spec, tmp_path):
    """No modules.json: sentence-transformers wraps the transformer with mean pooling."""
    folder = tmp_path / "plain"
    shutil.copytree(model_spec.path, folder)
    (folder / "modules.json").unlink()
    spec = load_model_spec(str(folder))
    assert (spec.pooling, spec.normalize, spec.dim, spec.dense) == ("mean", False, 384, ())


def test_local_folder_model_and_cls_pooling(model_spec, tmp_path):
    folder = tmp_path / "my-model"
    shutil.copytree(model_spec.path, folder)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    spec = load_model_spec(str(folder))
    assert spec.name == "my-model" and spec.pooling == "cls" and spec.revision == model_spec.revision
    # Same weights, other vectors: the configuration's hash tells them apart (the cache's key and
    # the ONNX export's name carry it).
    assert spec.config_hash != model_spec.config_hash and len(spec.config_hash) == 8


def test_the_revision_changes_with_weights_changed_only_in_the_middle(model_spec, tmp_path):
    """A fine-tune of the middle layers keeps a file's size, header and last tensors: the revision
    had hashed only the first and last MiB, and an ONNX export of the other model was reused."""
    folder = tmp_path / "tuned"
    shutil.copytree(model_spec.path, folder)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(4096)  # a slice of one tensor, mid-file
    weights.write_bytes(bytes(data))
    spec = load_model_spec(str(folder))
    assert spec.revision != model_spec.revision
    assert spec.config_hash == load_model_spec(str(model_spec.path)).config_hash  # configs untouched


def test_the_weights_are_hashed_once_while_their_files_stay_the_same(model_spec, tmp_path, monkeypatch):
    """`windve serve` reads the spec to check the plan and again to start the engines: the second
    read must not hash the weights again (a second per GB), and a file rewritten in place (same
    path, inode and size) must not keep the old revision."""
    import hashlib

    folder = tmp_path / "model"
    shutil.copytree(model_spec.path, folder)
    first = load_model_spec(str(folder))
    reads = []
    real = hashlib.file_digest
    monkeypatch.setattr(hashlib, "file_digest", lambda handle, name: reads.append(handle.name) or real(handle, name))
    assert load_model_spec(str(folder)).revision == first.revision and reads == []
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with weights.open("r+b") as handle:  # in place: the inode and size stay
        handle.write(data)
    assert load_model_spec(str(folder)).revision != first.revision and reads == [str(weights)]


def test_the_spec_crosses_processes_as_json(model_spec):
    """Engine and front-end processes get the parent's spec as JSON, not the weights to hash again."""
    assert ModelSpec(**json.loads(json.dumps(model_spec.to_dict()))) == model_spec


def test_pickled_weights_are_refused(model_spec, tmp_path):
    folder = tmp_path / "pickled"
    shutil.copytree(model_spec.path, folder)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(ModelError, match="safetensors"):
        load_model_spec(str(folder))


def test_remote_code_needs_consent(model_spec, tmp_path):
    folder = tmp_path / "remote"
    shutil.copytree(model_spec.path, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_custom.CustomModel"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="TRUST_REMOTE_CODE"):
        load_model_spec(str(folder))
    assert load_model_spec(str(folder), trust_remote_code=True).trust_remote_code


def test_unknown_model_id_is_a_clear_error():
    with pytest.raises(ModelError, match="never downloads"):
        load_model_spec("nobody/no-such-model-xyz")


def test_an_empty_plan_in_the_config_file_is_refused_not_ignored(tmp_path):
    config = tmp_path / "plan.yaml"
    config.write_text("plan: []\n")  # without cpu_layout: explicit, it had been read as no plan
    result = subprocess.run(
        [sys.executable, "-m", "windve.commands.serve", "--config", str(config)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2 and "the `plan:` list is empty" in result.stderr, result.stderr


def test_unreadable_model_files_are_one_clear_error(model_spec, tmp_path):
    """A weight file that is a dangling link (a hub cache missing its blob) had ended `windve serve`
    in a 32-line FileNotFoundError traceback; a broken config.json in a JSON error naming no file."""
    folder = tmp_path / "broken"
    shutil.copytree(model_spec.path, folder)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(tmp_path / "blobs" / "missing")
    with pytest.raises(ModelError, match=r"cannot read .*model\.safetensors: No such file or directory"):
        load_model_spec(str(folder))
    (folder / "model.safetensors").unlink()
    shutil.copy(model_spec.path / "model.safetensors", folder / "model.safetensors")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="config.json is not valid JSON"):
        load_model_spec(str(folder))


def test_a_broken_tokenizer_names_its_file_and_model(tmp_path, model_spec) -> None:
    """tokenizers' own error for a damaged tokenizer.json is "expected value at line 1 column 1",
    naming nothing; a folder with no vocabulary at all loaded as 5 special tokens (transformers 5),
    so that every word embedded as [UNK]."""
    from windve.tokenizer import load_fast_tokenizer

    folder = tmp_path / "broken"
    shutil.copytree(model_spec.path, folder)
    (folder / "tokenizer.json").write_text("garbage{")
    with pytest.raises(ModelError, match=rf"model folder {folder}: tokenizer.json is not a tokenizer"):
        load_fast_tokenizer(folder)
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        (folder / name).unlink(missing_ok=True)
    with pytest.raises(ModelError, match=rf"model folder {folder} has no tokenizer: none of tokenizer.json, vocab.txt"):
        load_fast_tokenizer(folder)
    (folder / "vocab.txt").write_bytes(b"\xff\xfe not a vocabulary")
    with pytest.raises(ModelError, match=rf"model folder {folder} has no tokenizer.json, and no other tokenizer loads"):
        load_fast_tokenizer(folder)


def test_a_cut_short_or_foreign_weight_file_is_named_at_the_start(tmp_path, model_spec) -> None:
    """An interrupted download passed every check of the folder, then failed in each engine
    process as "incomplete metadata, file not fully covered", naming no file."""
    folder = tmp_path / "partial"
    shutil.copytree(model_spec.path, folder)
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    os.truncate(weights, size // 2)
    with pytest.raises(ModelError, match=rf"model.safetensors is cut short, {size // 2:,} of the {size:,} bytes"):
        load_model_spec(str(folder))
    weights.write_bytes(b"<html>404 Not Found</html>")  # what a proxy may hand a download
    with pytest.raises(ModelError, match="model.safetensors is not a safetensors file"):
        load_model_spec(str(folder))
