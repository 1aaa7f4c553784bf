"""``libra.config.load_config``: CLI > environment > file > defaults, and coercion.

Everything is real; the environment is passed in as a dict and files live in tmp_path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from libra.config import knob, load_config, mask_url_password, option_names, redact


@dataclass(frozen=True, kw_only=True, slots=True)
class Group:
    endpoint: str = knob("default-endpoint", "an endpoint")
    verbose: bool = knob(False, "talk more")


@dataclass(frozen=True, kw_only=True, slots=True)
class DemoConfig:
    group: Group = field(default_factory=Group)
    port: int = knob(1000, "a port")
    ratio: float = knob(0.5, "a ratio")
    tags: list[str] = knob(["a"], "some tags")
    sizes: list[int] = knob([], "some sizes")
    api_token: str = knob("", "a secret")


def load(argv: list[str] | None = None, env: dict[str, str] | None = None,
         file_text: str | None = None, tmp_path: Path | None = None) -> DemoConfig:
    args = list(argv or [])
    if file_text is not None:
        assert tmp_path is not None
        path = tmp_path / "demo.toml"
        path.write_text(file_text)
        args = ["--config", str(path), *args]
    return load_config(DemoConfig, "demo", argv=args, environ=env or {})


def test_defaults_apply_when_nothing_is_set() -> None:
    cfg = load()
    assert cfg == DemoConfig()
    assert (cfg.port, cfg.group.endpoint, cfg.tags) == (1000, "default-endpoint", ["a"])


def test_list_defaults_are_not_shared_between_instances() -> None:
    assert DemoConfig().tags is not DemoConfig().tags


def test_file_overrides_defaults(tmp_path: Path) -> None:
    cfg = load(file_text="port = 2000\n[group]\nendpoint = \"file\"\n", tmp_path=tmp_path)
    assert (cfg.port, cfg.group.endpoint) == (2000, "file")


def test_service_section_of_a_shared_file_overrides_common_keys(tmp_path: Path) -> None:
    path = tmp_path / "stack.toml"
    path.write_text("ratio = 0.1\nport = 1\n[group]\nendpoint = \"common\"\n"
                    "[scheduler]\nport = 3000\n[scheduler.group]\nverbose = true\n"
                    "[rollout]\nport = 4000\n")
    cfg = load_config(DemoConfig, "scheduler", argv=["--config", str(path)], environ={})
    assert (cfg.port, cfg.ratio) == (3000, 0.1)
    assert (cfg.group.endpoint, cfg.group.verbose) == ("common", True)


def test_env_overrides_file(tmp_path: Path) -> None:
    cfg = load(env={"LIBRA_DEMO_PORT": "3000"}, file_text="port = 2000\n", tmp_path=tmp_path)
    assert cfg.port == 3000


def test_cli_overrides_env_and_file(tmp_path: Path) -> None:
    cfg = load(argv=["--port", "4000"], env={"LIBRA_DEMO_PORT": "3000"},
               file_text="port = 2000\n", tmp_path=tmp_path)
    assert cfg.port == 4000


def test_config_file_can_come_from_env(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("port = 2500\n")
    cfg = load_config(DemoConfig, "demo", argv=[], environ={"LIBRA_DEMO_CONFIG": str(path)})
    assert cfg.port == 2500


def test_env_group_field_uses_double_underscore() -> None:
    cfg = load(env={"LIBRA_DEMO_GROUP__ENDPOINT": "env-endpoint"})
    assert cfg.group.endpoint == "env-endpoint"


def test_env_without_service_applies_to_every_service() -> None:
    assert load(env={"LIBRA_PORT": "1234"}).port == 1234


def test_service_specific_env_wins_over_generic_env() -> None:
    assert load(env={"LIBRA_PORT": "1", "LIBRA_DEMO_PORT": "2"}).port == 2


def test_env_of_another_service_is_ignored() -> None:
    assert load(env={"LIBRA_OTHER_PORT": "9"}).port == 1000


def test_cli_group_option_uses_dotted_dashed_name() -> None:
    cfg = load(argv=["--group.endpoint", "cli", "--group.verbose", "yes", "--api-token", "x"])
    assert (cfg.group.endpoint, cfg.group.verbose, cfg.api_token) == ("cli", True, "x")


@pytest.mark.parametrize(("raw", "want"), [("1", True), ("true", True), ("On", True),
                                           ("0", False), ("false", False), ("no", False)])
def test_bool_is_read_from_common_spellings(raw: str, want: bool) -> None:
    assert load(env={"LIBRA_DEMO_GROUP__VERBOSE": raw}).group.verbose is want


def test_bool_from_file_is_kept(tmp_path: Path) -> None:
    assert load(file_text="[group]\nverbose = true\n", tmp_path=tmp_path).group.verbose is True


def test_int_and_float_are_coerced_from_strings() -> None:
    cfg = load(env={"LIBRA_DEMO_PORT": "42", "LIBRA_DEMO_RATIO": "0.25"})
    assert (cfg.port, cfg.ratio) == (42, 0.25)
    assert isinstance(cfg.port, int) and isinstance(cfg.ratio, float)


def test_float_field_accepts_int_from_file(tmp_path: Path) -> None:
    cfg = load(file_text="ratio = 2\n", tmp_path=tmp_path)
    assert cfg.ratio == 2.0 and isinstance(cfg.ratio, float)


def test_list_is_split_on_commas_from_env() -> None:
    cfg = load(env={"LIBRA_DEMO_TAGS": "x, y,,z", "LIBRA_DEMO_SIZES": "1,2"})
    assert (cfg.tags, cfg.sizes) == (["x", "y", "z"], [1, 2])


def test_list_from_file_is_coerced_per_item(tmp_path: Path) -> None:
    cfg = load(file_text="sizes = [\"3\", 4]\n", tmp_path=tmp_path)
    assert cfg.sizes == [3, 4]


def test_unknown_file_key_raises_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="prot"):
        load(file_text="prot = 1\n", tmp_path=tmp_path)


def test_unknown_group_key_in_file_raises_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"group\.endpiont"):
        load(file_text="[group]\nendpiont = \"x\"\n", tmp_path=tmp_path)


@pytest.mark.parametrize(("env", "option"), [
    ({"LIBRA_DEMO_PORT": "many"}, "port"),
    ({"LIBRA_DEMO_RATIO": "half"}, "ratio"),
    ({"LIBRA_DEMO_GROUP__VERBOSE": "maybe"}, "group.verbose"),
    ({"LIBRA_DEMO_SIZES": "1,two"}, "sizes"),
])
def test_bad_env_value_raises_value_error_naming_option(env: dict[str, str],
                                                        option: str) -> None:
    with pytest.raises(ValueError, match=f"config {option}:"):
        load(env=env)


@pytest.mark.parametrize(("text", "option"), [
    ("port = 1.5\n", "port"),
    ("port = true\n", "port"),
    ("tags = 5\n", "tags"),
])
def test_bad_file_value_raises_value_error_naming_option(tmp_path: Path, text: str,
                                                         option: str) -> None:
    with pytest.raises(ValueError, match=f"config {option}:"):
        load(file_text=text, tmp_path=tmp_path)


def test_option_names_flatten_groups_in_declaration_order() -> None:
    assert option_names(DemoConfig) == ["group.endpoint", "group.verbose", "port", "ratio",
                                        "tags", "sizes", "api_token"]


def test_redact_masks_secrets_only_when_set() -> None:
    shown = redact(load(env={"LIBRA_DEMO_API_TOKEN": "s3cret"}))
    assert shown["api_token"] == "***"
    assert shown["port"] == 1000
    assert redact(load())["api_token"] == ""


def test_redact_masks_the_password_inside_a_url() -> None:
    # libra up gives Redis a password, and services log their redis_url at start-up.
    from services.trainer.config import TrainerConfig

    cfg = TrainerConfig(redis_url="redis://:pa55-word@127.0.0.1:6379/0")
    assert redact(cfg)["redis_url"] == "redis://:***@127.0.0.1:6379/0"
    assert mask_url_password("redis://user:pw@h:1/0 and http://h/a:b@c") == (
        "redis://user:***@h:1/0 and http://h/a:b@c")
    assert mask_url_password("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


@dataclass(frozen=True, kw_only=True, slots=True)
class WithGroupDefault:
    group: Group = field(default_factory=lambda: Group(endpoint="service-default"))


def test_group_default_from_parent_factory_is_kept() -> None:
    cfg = load_config(WithGroupDefault, "demo", argv=[], environ={})
    assert cfg.group.endpoint == "service-default"


def test_group_default_from_parent_factory_is_overridable() -> None:
    cfg = load_config(WithGroupDefault, "demo", argv=[],
                      environ={"LIBRA_DEMO_GROUP__VERBOSE": "1"})
    assert (cfg.group.endpoint, cfg.group.verbose) == ("service-default", True)
