"""Each default is written once, in its config: the options of ``run``, ``serve`` and ``worker`` that set a config
field show that field's default, and every other option is listed here with why it has a default of its own."""

from __future__ import annotations

import click
import pytest

from cli.main import main
from cli.options import OPTION_FIELDS, Command, field_default

# Options that set no config field one to one, and why.
OWN_DEFAULTS: dict[Command, dict[str, str]] = {
    "run": {
        "policy": "chooses a policy from the registry, not a config field",
        "order": "RunConfig.order spelled with dashes (longest-first)",
        "summary_json": "a file the command writes",
        "step_caps": "EASY,MEDIUM,HARD text, parsed into RunConfig.step_caps",
        "no_spawn": "the inverse of RunConfig.spawn_workers",
        "tui": "how the command shows the run",
        "stragglers": "switches RunConfig.straggler_fraction on (None: off)",
        "straggler_fraction": "the fraction used once --stragglers is given",
        "blocklist_hours": "RunConfig.blocklist_ttl_s in hours",
        "proxies": "repeatable: a list built with --proxy-file",
        "proxy_file": "a file read into WorkerConfig.proxies",
        "request_rules": "repeatable paths, resolved into WorkerConfig.request_rules",
        "net_allow": "repeatable: NetSettings.allow",
        "net_deny": "repeatable: NetSettings.deny",
    },
    "serve": {
        "api_key_env": "the variable WebGym's clients read the key from (CPU_CLUSTER_TOKEN)",
        "record": "ServerConfig.record, a flag",
        "sites": "whether the command also serves the bundled sites",
        "no_spawn": "the inverse of RunConfig.spawn_workers",
        "net_allow": "repeatable: NetSettings.allow",
        "net_deny": "repeatable: NetSettings.deny",
    },
    "worker": {
        "connect": "required: the engine's endpoint",
        "worker_id": "default: host-pid, made when the worker starts",
        "server_key": "a key file",
        "key": "a key file",
        "net_deny": "repeatable: NetSettings.deny",
    },
}


def _options(command: Command) -> dict[str, click.Option]:
    cmd = main.commands[command]
    return {p.name: p for p in cmd.params if isinstance(p, click.Option) and p.name}


@pytest.mark.parametrize("command", ["run", "serve", "worker"])
def test_every_option_shows_its_config_fields_default_or_says_why_not(command: Command) -> None:
    options = _options(command)
    ctx = click.Context(main.commands[command])
    mapped, own = OPTION_FIELDS[command], OWN_DEFAULTS[command]
    assert not set(mapped) & set(own)
    unaccounted = sorted(set(options) - set(mapped) - set(own))
    assert unaccounted == [], f"{command}: options that set which config field? {unaccounted}"
    assert sorted(set(mapped) - set(options)) == [], "the table names options the command does not have"
    assert sorted(set(own) - set(options)) == [], "OWN_DEFAULTS names options the command does not have"
    wrong = {name: (options[name].get_default(ctx), field_default(command, name)) for name in mapped
             if options[name].get_default(ctx) != field_default(command, name)}
    assert wrong == {}

