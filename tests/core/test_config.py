"""TOML config loading: precise locations, did-you-mean, env overrides, types."""

from __future__ import annotations

import pytest
from warpdata.core.config import (
    Field,
    KeyLocator,
    describe,
    load_config,
    non_negative,
    parse_toml,
    positive,
)
from warpdata.core.errors import ConfigError, ExitCode, MissingInputError

SCHEMA = {
    "source": {
        "format": Field(str, choices=("coco", "yolo", "jsonl"), help="label format"),
        "path": Field(str, help="where the labels are"),
    },
    "transform": {
        "size": Field(int, 640, check=positive),
        "scale": Field(float, 1.0, check=non_negative),
        "mean": Field(list, [0.0, 0.0, 0.0], item_type=float),
        "flip": Field(bool, False),
    },
    "output": {
        "workers": Field(int, 2, env="WARP_WORKERS", check=positive),
        "backend": Field(str, "auto", choices=("auto", "cpu", "gpu"), env="WARP_BACKEND"),
    },
}

GOOD = """\
# a comment
[source]
format = "coco"
path = "labels.json"

[transform]
size = 320
scale = 2
mean = [0.5, 0.5, 1]
"""


def write(tmp_path, text: str):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def err(tmp_path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text), SCHEMA)
    assert e.value.exit_code == ExitCode.CONFIG
    return e.value


def test_valid_config_gets_defaults_and_widened_floats(tmp_path):
    cfg, source = load_config(write(tmp_path, GOOD), SCHEMA)
    assert cfg["source"] == {"format": "coco", "path": "labels.json"}
    assert cfg["transform"] == {"size": 320, "scale": 2.0, "mean": [0.5, 0.5, 1], "flip": False}
    assert type(cfg["transform"]["scale"]) is float  # TOML `2` where a number is expected
    assert cfg["output"] == {"workers": 2, "backend": "auto"}
    assert source.where("transform.size") == f"{tmp_path / 'c.toml'}:7"


def test_wrong_type_names_file_line_key_and_expected_type(tmp_path):
    e = err(tmp_path, GOOD.replace("size = 320", 'size = "big"'))
    assert e.message == f"{tmp_path / 'c.toml'}:7: 'transform.size' must be an integer, got 'big'"
    assert e.details == {"file": str(tmp_path / "c.toml"), "key": "transform.size"}


def test_bool_is_not_an_integer(tmp_path):
    e = err(tmp_path, GOOD.replace("size = 320", "size = true"))
    assert "'transform.size' must be an integer, got True" in e.message


def test_list_items_are_checked(tmp_path):
    e = err(tmp_path, GOOD.replace("mean = [0.5, 0.5, 1]", 'mean = [0.5, "x"]'))
    assert f"{tmp_path / 'c.toml'}:9: 'transform.mean[1]' must be a number" in e.message


def test_unknown_key_did_you_mean(tmp_path):
    e = err(tmp_path, GOOD.replace("size = 320", "sise = 320"))
    assert e.message == f"{tmp_path / 'c.toml'}:7: unknown key 'transform.sise'"
    assert e.hint == "did you mean 'transform.size'?"


def test_unknown_table_lists_valid_keys(tmp_path):
    e = err(tmp_path, GOOD + "\n[zzz]\na = 1\n")
    assert e.message.endswith("unknown key 'zzz'") and ":11:" in e.message
    assert e.hint == "valid keys here: output, source, transform"


def test_bad_choice_did_you_mean(tmp_path):
    e = err(tmp_path, GOOD.replace('"coco"', '"cocoo"'))
    assert f"{tmp_path / 'c.toml'}:3: 'source.format' must be one of 'coco', 'yolo', 'jsonl'" in e.message
    assert e.hint == "did you mean 'coco'?"


def test_check_callable(tmp_path):
    e = err(tmp_path, GOOD.replace("size = 320", "size = 0"))
    assert "'transform.size' must be > 0, got 0" in e.message and ":7:" in e.message


def test_missing_required_key(tmp_path):
    e = err(tmp_path, GOOD.replace('path = "labels.json"\n', ""))
    assert f"{tmp_path / 'c.toml'}:2: missing required key 'source.path'" in e.message
    assert e.hint == "add `path = ...` under [source]"


def test_table_given_as_value(tmp_path):
    e = err(tmp_path, 'source = 3\n')
    assert "'source' must be a table" in e.message and e.hint == "write it as [source]"


@pytest.mark.parametrize(("text", "line", "col"), [
    ('[source]\nformat = "coco"\npath = \n', 3, 8),
    ("[source\n", 1, 8),
    ('a = "unterminated\n', 1, 18),
    ("a = 1\na = 2\n", 2, 6),
])
def test_toml_syntax_error_has_file_line_column(tmp_path, text, line, col):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        parse_toml(p)
    assert e.value.message.startswith(f"{p}:{line}:{col}: TOML syntax error: ")
    assert "(at line" not in e.value.message
    assert e.value.details == {"file": str(p), "line": line, "column": col}


def test_missing_file_is_missing_input(tmp_path):
    with pytest.raises(MissingInputError) as e:
        parse_toml(tmp_path / "nope.toml")
    assert e.value.exit_code == ExitCode.NO_INPUT and isinstance(e.value, FileNotFoundError)


def test_directory_or_binary_is_config_error(tmp_path):
    with pytest.raises(ConfigError):
        parse_toml(tmp_path)
    (tmp_path / "b.toml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError):
        parse_toml(tmp_path / "b.toml")


def test_env_overrides_file(tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_WORKERS", "7")
    monkeypatch.setenv("WARP_BACKEND", "cpu")
    cfg, _ = load_config(write(tmp_path, GOOD + "\n[output]\nworkers = 3\n"), SCHEMA)
    assert cfg["output"] == {"workers": 7, "backend": "cpu"}


def test_bad_env_value_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_WORKERS", "many")
    e = err(tmp_path, GOOD)
    assert "WARP_WORKERS='many'" in e.message and "WARP_WORKERS" in e.hint
    monkeypatch.setenv("WARP_WORKERS", "0")
    e = err(tmp_path, GOOD)
    assert e.message.startswith("environment variable WARP_WORKERS")
    monkeypatch.delenv("WARP_WORKERS")
    monkeypatch.setenv("WARP_BACKEND", "gpux")
    e = err(tmp_path, GOOD)
    assert e.message.startswith("environment variable WARP_BACKEND") and e.hint == "did you mean 'gpu'?"


def test_unregistered_env_var_is_a_bug():
    schema = {"x": Field(int, 1, env="WARP_NOT_REGISTERED")}
    with pytest.raises(KeyError, match="not in warp's registry"):
        from warpdata.core.config import ConfigSource, validate

        validate({}, schema, ConfigSource("t.toml", ""))


def test_key_locator_handles_quotes_dotted_keys_and_array_tables():
    text = ('top = 1\n[a]\n"quoted key" = 2\nb.c = 3\n[[runs]]\nname = "x"\n[a.sub]\nd = 4\n')
    loc = KeyLocator.from_text(text)
    assert loc.line("top") == 1
    assert loc.line("a.quoted key") == 3
    assert loc.line("a.b.c") == 4
    assert loc.line("runs") == 5 and loc.line("runs.name") == 6
    assert loc.line("a.sub.d") == 8
    assert loc.line("a.sub.missing") == 7  # falls back to the enclosing table
    assert loc.line("nowhere") is None


def test_describe_documents_the_schema():
    rows = {r[0]: r for r in describe(SCHEMA)}
    assert rows["source.path"][1:3] == ("a string", "(required)")
    assert rows["source.format"][1] == "coco | yolo | jsonl"
    assert rows["output.workers"][3].endswith("[env WARP_WORKERS]")


@pytest.mark.parametrize("old, new, key, words", [
    ("scale = 2", "scale = 1e400", "transform.scale", "must be a finite number, got inf"),
    ("scale = 2", "scale = nan", "transform.scale", "must be a finite number, got nan"),
    ("scale = 2", "scale = -inf", "transform.scale", "must be a finite number"),
    ("size = 320", "size = 1000000000000000000000000000000", "transform.size", "too large (31 digits"),
    ("size = 320", "size = 9223372036854775808", "transform.size", "integers must fit in 64 bits"),
    ("mean = [0.5, 0.5, 1]", "mean = [0.5, 1e999, 1]", "transform.mean[1]", "finite"),
])
def test_numbers_no_setting_can_use_name_the_key(tmp_path, old, new, key, words):
    """1e400 parses as inf and TOML ints past 64 bits parse in Python: both are config errors (exit 78)."""
    e = err(tmp_path, GOOD.replace(old, new))
    assert f"'{key}'" in e.message and words in e.message
    assert e.message.startswith(f"{tmp_path / 'c.toml'}:")


def test_largest_64_bit_integer_is_fine(tmp_path):
    cfg, _ = load_config(write(tmp_path, GOOD.replace("size = 320", "size = 9223372036854775807")), SCHEMA)
    assert cfg["transform"]["size"] == 2**63 - 1


def test_env_value_must_be_finite(tmp_path, monkeypatch):
    monkeypatch.setenv("WARP_WORKERS", "1" + "0" * 30)
    e = err(tmp_path, GOOD)
    assert "environment variable WARP_WORKERS" in e.message and "64 bits" in e.message
