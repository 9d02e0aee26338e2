"""The settings table agrees with the loader's value table and with ``Config``."""

from __future__ import annotations

import dataclasses

from sono.config import KEYS, Config
from sono.settings import BY_KEY, OPTIONS, flag_name


def test_every_key_has_a_config_field_and_every_field_a_key() -> None:
    fields = {f.name for f in dataclasses.fields(Config)} - {"sources", "project_file"}
    assert sorted(o.field for o in OPTIONS) == sorted(fields)


def test_the_names_and_the_values_cover_the_same_keys_in_the_same_order() -> None:
    assert tuple(o.key for o in OPTIONS) == KEYS


def test_env_vars_and_flags_are_each_declared_once() -> None:
    envs = [e for o in OPTIONS for e in o.env]
    flags = [f for o in OPTIONS for f in o.flags]
    assert len(envs) == len(set(envs)) and len(flags) == len(set(flags))
    assert len({o.dest for o in OPTIONS}) == len(OPTIONS)


def test_a_flag_has_a_long_spelling_help_and_a_metavar() -> None:
    for option in OPTIONS:
        if option.flags:
            assert option.flag.startswith("--") and option.help and option.metavar, option.key


def test_flag_name_is_the_table_spelling() -> None:
    assert flag_name("iteration_timeout") == "--timeout"
    assert flag_name("network.mode") == "--network"
    assert flag_name("limits.memory") == "--memory"
    assert flag_name("agent_cmd") == "--agent-cmd"
    assert flag_name("commit_retries") == "--commit-retries"  # no flag: named after the key


def test_a_settings_flag_is_taken_where_it_changes_something_and_by_config() -> None:
    assert BY_KEY["max_cost"].takes("continue") and not BY_KEY["max_cost"].takes("list")
    assert BY_KEY["harness"].takes("plan") and not BY_KEY["harness"].takes("list")
    assert BY_KEY["limits.memory"].takes("shell") and not BY_KEY["limits.memory"].takes("diff")
    assert BY_KEY["iterations"].takes("demo") and not BY_KEY["iterations"].takes("merge")
    assert all(o.takes("config") for o in OPTIONS if o.flags)
    assert not BY_KEY["pager"].takes("run")  # no flag at all
